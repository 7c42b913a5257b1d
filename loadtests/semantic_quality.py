"""Quality of the semantic cache's decision on labelled pairs never used for training or tuning.

Protocol, per pair: the first sentence is the cached question (alone in its namespace), the second
is asked; a hit on a label-1 pair is right, a hit on a label-0 pair is a false hit. Scored per set
(the holdout split of PAWS-Wiki dev, of chat_pairs.tsv and of the hand-written written/*.tsv, and
all of the hand-written near_misses.tsv, order_probe.tsv, context_probe.tsv, forum_probe.tsv,
kinds_probe*.tsv and unseen/*.tsv; see loadtests/verifier_data.py) for four deciders:

- floor: plain cosine of the cache's embedder (MiniLM) against a threshold;
- guards: cosine threshold, then the lexical near-miss guards (gateway/cache/guards.py);
- verifier: candidates at cosine >= the retrieval floor, then the pair classifier's probability
  against a threshold (gateway/cache/verifier.py; its near-miss rules, `near_miss_rules.near_miss`,
  refuse a modifier added, another member of a kind, two names exchanged or operators moved
  whatever the trees say);
- verifier+guards: the verifier, and the guards may still veto;
- verifier, pair only: the verifier without the cache's shared-context rule (two long texts
  sharing most of their words are judged by the clauses they differ in,
  `gateway/cache/shared_context.py`).

Then a shared-cache run through the real `SemanticCache`: every first sentence of a set in one
namespace, every second sentence asked (right / wrong / miss), as GPTCache's benchmark does.

For each: the hit rate at 1%, 2% and 5% false hits (the threshold chosen on that same set, so
this is the trade-off curve, not a tuned result), and the hit / false-hit rates at the shipped
defaults (cosine 0.88 for floor and guards; the model's threshold for the verifier).

    python -m loadtests.semantic_quality [--cosine-cache /tmp/cos.json]

Writes loadtests/data/results/semantic_quality.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gateway.cache import guards
from gateway.cache.semantic_settings import GuardSettings
from gateway.cache.shared_context import differing_clauses
from gateway.cache.verifier import default_verifier
from loadtests.train_verifier import embed_cosines
from loadtests.verifier_data import (
    PROBES,
    Pair,
    load_chat,
    load_context_probe,
    load_near_misses,
    load_order_probe,
    load_paws,
    load_probe,
    load_unseen,
    load_written,
)

OUT = Path(__file__).parent / "data" / "results"
RATES = (0.01, 0.02, 0.05)
DEFAULT_COSINE = 0.88
ALL_GUARDS = GuardSettings()


def deciders() -> dict[str, tuple[Callable[[Pair], float], float]]:
    """name -> (score of a pair, default threshold); a pair is served when score >= threshold."""
    v = default_verifier()

    def guarded(p: Pair) -> bool:
        return guards.check(p.s2, p.s1, ALL_GUARDS) is None

    def pair_only(p: Pair) -> float:
        return v.probability(p.s2, p.s1, p.cosine) if p.cosine >= v.retrieval_floor else 0.0

    def verified(p: Pair) -> float:
        """As the cache decides: the pair, or its differing clauses where a context is shared."""
        clauses = _CLAUSES.get((p.s1, p.s2))
        if clauses is None:
            return pair_only(p)
        if not clauses.s1 or not clauses.s2:
            return 0.0  # a clause one text lacks altogether: never the same question
        return pair_only(clauses)

    return {
        "floor (cosine)": (lambda p: p.cosine, DEFAULT_COSINE),
        "guards": (lambda p: p.cosine if guarded(p) else -1.0, DEFAULT_COSINE),
        "verifier": (verified, v.threshold),
        "verifier+guards": (lambda p: verified(p) if guarded(p) else -1.0, v.threshold),
        "verifier, pair only": (pair_only, v.threshold),
    }


#: (cached, asked) -> the pair of their differing clauses, for pairs sharing a dominant context.
_CLAUSES: dict[tuple[str, str], Pair] = {}


async def embed_clauses(pairs: list[Pair], cache: Path | None) -> None:
    """The differing clauses of pairs that share a dominant context, with their cosines: the
    cache judges those too (`gateway/cache/shared_context.py`)."""
    todo = []
    for p in pairs:
        parts = differing_clauses(p.s2, p.s1)
        if parts is not None:
            clause = Pair(parts[1], parts[0], p.label, p.kind, p.source, p.split)
            _CLAUSES[(p.s1, p.s2)] = clause
            todo.append(clause)
    await embed_cosines(todo, cache=cache)


def curve(scores: np.ndarray, labels: np.ndarray, rate: float) -> tuple[float, float]:
    """Best hit rate with false-hit rate <= rate, and the threshold that gives it."""
    neg = np.sort(scores[labels == 0])[::-1]
    pos = scores[labels == 1]
    allowed = int(np.floor(rate * len(neg)))
    # serve everything strictly above the (allowed+1)-th highest negative score
    if allowed >= len(neg):
        return float((pos > -np.inf).mean()), -np.inf
    bar = neg[allowed]
    return float((pos > bar).mean()), float(bar)


def evaluate(name: str, pairs: list[Pair]) -> dict:
    labels = np.array([p.label for p in pairs])
    result: dict = {"pairs": len(pairs), "positives": int(labels.sum()), "deciders": {}}
    for dname, (score, default_t) in deciders().items():
        s = np.array([score(p) for p in pairs])
        served = s >= default_t
        wrong_kinds: dict[str, int] = {}
        for p, hit in zip(pairs, served, strict=True):
            if hit and not p.label:
                wrong_kinds[p.kind] = wrong_kinds.get(p.kind, 0) + 1
        result["deciders"][dname] = {
            "at_false": {f"{r:.0%}": curve(s, labels, r)[0] for r in RATES},
            "default_threshold": default_t,
            "default_hit": float(served[labels == 1].mean()),
            "default_false": float(served[labels == 0].mean()),
            "false_hits_by_kind": wrong_kinds,
            "by_cosine": by_cosine(pairs, served),
        }
    return result


BANDS = ((0.0, 0.80), (0.80, 0.88), (0.88, 1.01))


def by_cosine(pairs: list[Pair], served: np.ndarray) -> dict[str, dict[str, float]]:
    """Default hit and false-hit rates within cosine bands: what a decider adds where plain
    cosine cannot separate (a public set's paraphrases may sit mostly in one band)."""
    out = {}
    for lo, hi in BANDS:
        inside = np.array([lo <= p.cosine < hi for p in pairs])
        pos = inside & np.array([p.label == 1 for p in pairs])
        neg = inside & ~pos
        out[f"{lo:.2f}-{min(hi, 1.0):.2f}"] = {
            "same": int(pos.sum()),
            "other": int(neg.sum()),
            "hit": float(served[pos].mean()) if pos.any() else 0.0,
            "false": float(served[neg].mean()) if neg.any() else 0.0,
        }
    return out


def band_markdown(results: dict[str, dict], decider: str = "verifier") -> str:
    lines = ["| set | cosine band | pairs: same / other | verifier default: hits / false hits |",
             "|---|---|---|---|"]  # fmt: skip
    for set_name, r in results.items():
        label = set_name
        for band, b in r["deciders"][decider]["by_cosine"].items():
            lines.append(
                f"| {label} | {band} | {b['same']} / {b['other']} | "
                f"{b['hit']:.1%} / {b['false']:.1%} |"
            )
            label = ""
    return "\n".join(lines)


def markdown(results: dict[str, dict]) -> str:
    lines = ["| set | decider | hits @1% false | @2% | @5% | default: hits / false hits |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for set_name, r in results.items():
        label = f"{set_name} ({r['positives']} same / {r['pairs'] - r['positives']} other)"
        for dname, d in r["deciders"].items():
            at = d["at_false"]
            lines.append(
                f"| {label} | {dname} | {at['1%']:.1%} | {at['2%']:.1%} | {at['5%']:.1%} | "
                f"{d['default_hit']:.1%} / {d['default_false']:.1%} |"
            )
            label = ""
    return "\n".join(lines)


async def shared_cache(pairs: list[Pair]) -> dict[str, dict[str, int]]:
    """Every distinct first sentence cached in ONE namespace, every second sentence asked, through
    the real `SemanticCache` (embedding, FAISS top-k, decision): GPTCache's protocol on our sets.

    A paraphrase asked is right when served its own question (or another the set labels as its
    paraphrase), wrong when served another question, else a miss; a near miss asked is wrong when
    served anything not labelled as its paraphrase.
    """
    from gateway.cache.async_embedder import AsyncEmbedder
    from gateway.cache.embedder import make_embedder
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    same = {(p.s1, p.s2) for p in pairs if p.label}
    cached = list(dict.fromkeys(p.s1 for p in pairs))
    no_guards = GuardSettings(numbers=False, negation=False, entities=False, entity_order=False)
    configs = {
        "floor (cosine 0.88)": SemanticSettings(matcher="guards", guards=no_guards),
        "guards (0.88)": SemanticSettings(matcher="guards"),
        "verifier": SemanticSettings(),
    }
    worker = AsyncEmbedder(make_embedder("auto"), memo=8192)
    out: dict[str, dict[str, int]] = {}
    try:
        for name, settings in configs.items():
            cache = SemanticCache(settings, worker=worker)
            for q in cached:
                await cache.store("shared", q, q.encode(), wait_s=30)
            counts = {"right": 0, "wrong": 0, "miss": 0, "near_miss_served": 0, "near_misses": 0}
            for p in pairs:
                res = await cache.lookup("shared", p.s2)
                served = res.hit.question if res.hit is not None else None
                ok = served is not None and (served == p.s2 or (served, p.s2) in same)
                if p.label:
                    counts["right" if ok else "wrong" if served else "miss"] += 1
                else:
                    counts["near_misses"] += 1
                    counts["near_miss_served"] += int(served is not None and not ok)
            out[name] = counts
    finally:
        worker.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cosine-cache", default="", help="JSON file memoising pair cosines")
    ap.add_argument("--out-dir", default=str(OUT))
    ap.add_argument("--model", default="", help="another verifier model file (side-by-side runs)")
    args = ap.parse_args()
    if args.model:
        from gateway.cache import verifier

        verifier.MODEL_PATH = Path(args.model)
    t0 = time.perf_counter()
    sets = {
        "near_misses.tsv (hand-written)": load_near_misses(),
        "order_probe.tsv (hand-written)": load_order_probe(),
        "context_probe.tsv (hand-written)": load_context_probe(),
        **{f"{name} (hand-written, {label})": load_probe(name) for name, label in PROBES.items()},
        "chat_pairs.tsv holdout": [p for p in load_chat() if p.split == "holdout"],
        "written/*.tsv holdout": [p for p in load_written() if p.split == "holdout"],
        "unseen/*.tsv (domains never trained on)": load_unseen(),
        "PAWS-Wiki dev holdout": [p for p in load_paws() if p.split == "holdout"],
    }
    everything = [p for pairs in sets.values() for p in pairs]
    cache = Path(args.cosine_cache) if args.cosine_cache else None
    asyncio.run(embed_cosines(everything, cache=cache))
    asyncio.run(embed_clauses(everything, cache))
    results = {name: evaluate(name, pairs) for name, pairs in sets.items()}
    shared = {
        name: asyncio.run(shared_cache(pairs))
        for name, pairs in sets.items()
        if not name.startswith("PAWS")  # wiki sentences, not questions to a chat model
    }
    lines = [
        "| set (one shared namespace) | decider | paraphrases: right / wrong / miss | "
        "near misses served |",
        "|---|---|---|---|",
    ]
    for set_name, by in shared.items():
        label = set_name
        for dname, c in by.items():
            lines.append(
                f"| {label} | {dname} | {c['right']} / {c['wrong']} / {c['miss']} | "
                f"{c['near_miss_served']} of {c['near_misses']} |"
            )
            label = ""
    md = (
        "# Semantic cache quality (holdout; never trained or tuned on)\n\n"
        + markdown(results)
        + "\n\n"
        + band_markdown(results)
        + "\n\n"
        + "\n".join(lines)
        + f"\n\n{len(everything)} pairs in {time.perf_counter() - t0:.0f} s.\n"
    )
    results["shared"] = shared  # type: ignore[assignment]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "semantic_quality.md").write_text(md, encoding="utf-8")
    (out / "semantic_quality.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(md)
    for name, r in results.items():
        if name == "shared":
            continue
        for dname in ("guards", "verifier"):
            print(name, dname, "false hits by kind:", r["deciders"][dname]["false_hits_by_kind"])


if __name__ == "__main__":
    main()
