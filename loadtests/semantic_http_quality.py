"""GPTCache's protocol through the gateway's HTTP API, beside the same protocol computed offline.

    python -m loadtests.semantic_http_quality [--sets unseen,written,chat]

A `gateway serve` process at the default semantic settings (exact cache off, so every hit is the
semantic cache's) in front of the zero-latency simulator. Every first question of the chosen
holdout sets is asked once in one namespace (a miss: its answer is stored), then every second
question once, in file order, with the official `openai` client. An answer is known by its
`id` (the simulator numbers its answers). Requests ask `temperature: 0` (only deterministic
requests are cached by default). A hit for a paraphrase is right when it serves the
answer of its first question or of another asked question of the same group (a paraphrase of
it: what users would get once those are cached too, as misses are stored here); any other hit
is wrong. A hit for another question (a near miss) is counted as served. Beside it, the offline
figure (`train_verifier.SharedTune`, what `semantic_quality` reports: all first questions cached,
nothing else) on the same pairs, so what the HTTP path adds or loses shows.

Sets: `unseen/*.tsv` (never trained or tuned on), the holdout split of `written/*.tsv` and of
`chat_pairs.tsv`. Only 127.0.0.1; stops by itself.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from loadtests.processes import gateway_process
from loadtests.scrape import metric_sum, metrics_of
from loadtests.simulator.testing import spawn_fleet
from loadtests.verifier_data import Pair, load_chat, load_unseen, load_written

POLICY = """
providers:
  zero: {{base_url: '{url}', max_inflight: 4096}}
pools:
  main: {{members: [zero]}}
models:
  sem: {{pool: main, cache: {{exact: {{enabled: false}}, semantic: {{enabled: true}}}}}}
"""

_WORDS = re.compile(r"\w+")
SETS = {
    "unseen": load_unseen,
    "written": lambda: [p for p in load_written() if p.split == "holdout"],
    "chat": lambda: [p for p in load_chat() if p.split == "holdout"],
}


def offline(pairs: list[Pair]) -> dict[str, int]:
    """The same protocol computed from the shipped model, as `semantic_quality` does."""
    from loadtests.train_verifier import SharedTune, embed_texts, model_probability
    from loadtests.verifier_thresholds import Shipped

    shipped = Shipped()
    vectors = embed_texts([t for p in pairs for t in (p.s1, p.s2)])
    r = SharedTune(pairs, vectors).at(shipped.verifier.threshold, pt_of=model_probability(shipped))
    pos = sum(p.label for p in pairs)
    return {
        "right": round(r["right"] * pos),
        "wrong": round(r["wrong"] * pos),
        "near_misses_served": round(r["near_misses_served"] * (len(pairs) - pos)),
    }


def through_http(pairs: list[Pair], gw: str) -> dict[str, int]:
    from openai import OpenAI

    client = OpenAI(base_url=gw, api_key="unused", max_retries=0, timeout=30)
    owner: dict[str, str] = {}  # answer id -> the question whose upstream call produced it

    def ask(text: str) -> tuple[str, bool]:
        """The answer's id and whether it was a semantic hit (a miss's answer is stored)."""
        raw = client.chat.completions.with_raw_response.create(
            model="sem", messages=[{"role": "user", "content": text}], temperature=0
        )
        rid = raw.parse().id
        hit = raw.headers.get("x-gateway-cache") == "hit-semantic"
        if not hit:
            owner[rid] = text
        return rid, hit

    # One meaning per group of paraphrases (union-find over the positive pairs).
    # Texts that differ only in case, spaces or punctuation are one question.
    parent: dict[str, str] = {}

    def meaning(text: str) -> str:
        t = " ".join(_WORDS.findall(text.lower()))
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    for p in pairs:
        if p.label:
            parent[meaning(p.s2)] = meaning(p.s1)
    out = {"fill_hits": 0, "fill_wrong": 0, "right": 0, "wrong": 0, "miss": 0}
    out |= {"near_misses_served": 0, "other_served": 0, "own_served": 0}
    misses = 0
    for s1 in dict.fromkeys(p.s1 for p in pairs):
        rid, hit = ask(s1)
        misses += not hit
        out["fill_hits"] += hit
        out["fill_wrong"] += hit and meaning(owner[rid]) != meaning(s1)
    # The answers of misses are stored in the background: wait until every one is.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if metric_sum(metrics_of(gw), "gateway_semantic_stores_total", outcome="stored") >= misses:
            break
        time.sleep(0.2)
    for p in pairs:
        rid, hit = ask(p.s2)
        served = meaning(owner[rid]) if hit else None
        if p.label:
            key = "miss" if not hit else "right" if served == meaning(p.s1) else "wrong"
        elif not hit:
            continue
        elif served == meaning(p.s2):  # an earlier ask of the same question: its own answer
            key = "own_served"
        else:
            key = "near_misses_served" if served == meaning(p.s1) else "other_served"
        out[key] += 1
    out["refused_stores"] = int(
        metric_sum(metrics_of(gw), "gateway_semantic_stores_total", outcome="refused")
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="unseen,written,chat", help=", ".join(SETS))
    args = ap.parse_args()
    names = args.sets.split(",")
    if unknown := [n for n in names if n not in SETS]:
        ap.error(f"unknown set {unknown[0]!r}; sets: {', '.join(SETS)}")
    print("| set | pairs (paraphrases / other) | HTTP: right / wrong / miss | HTTP: near misses "
          "served (another question's answer) | offline: right / wrong | offline: near misses "
          "served | first questions served from the cache (wrong) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with (
        spawn_fleet([{"name": "zero", "profile": "zero-latency"}]) as fleet,
        tempfile.TemporaryDirectory(prefix="sem-http-quality-") as folder,
    ):
        for name in names:
            pairs = SETS[name]()
            pos = sum(p.label for p in pairs)
            policy = Path(folder) / f"policy-{name}.yaml"
            policy.write_text(POLICY.format(url=fleet.url("zero")), encoding="utf-8")
            # A fresh gateway per set: one namespace each, nothing left from another set.
            with gateway_process(policy, env={"GATEWAY_ACCESS_LOG": "0"}) as gw:
                h = through_http(pairs, gw)
            o = offline(pairs)
            print(
                f"| {name} | {len(pairs)} ({pos} / {len(pairs) - pos}) | "
                f"{h['right']} / {h['wrong']} / {h['miss']} | "
                f"{h['near_misses_served']} ({h['other_served']}) | "
                f"{o['right']} / {o['wrong']} | {o['near_misses_served']} | "
                f"{h['fill_hits']} ({h['fill_wrong']}) |",
                flush=True,
            )
            if h["refused_stores"]:
                print(f"  ({name}: {h['refused_stores']} stores refused)")


if __name__ == "__main__":
    main()
