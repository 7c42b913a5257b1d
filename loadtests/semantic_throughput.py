"""Semantic cache throughput and latency through the gateway, per embedding configuration.

Starts the zero-latency simulator and, for each configuration (embedding `workers` x `batch_max`,
optionally the vector memo on, a lookup budget, and waiting for every lookup),
a `gateway serve` process with two aliases in front of it: `sem` (semantic cache on, exact cache
off, vector memo off so every request really embeds its question) and `plain` (no cache). Then:

- hits: the questions (~15 or ~30 tokens) are stored once, then `--clients` concurrent clients
  ask them again for `--seconds` (each request embeds, searches and verifies): hits/s, p50, p99,
  and the gateway's CPU time per request (its `process_cpu_seconds_total` over the burst: what
  a change to the work per request moves; times hits/s, the cores the gateway kept busy);
- one client: sequential hits (p50), and sequential new questions to `sem` and to `plain`
  interleaved, so "what a miss adds" is the difference of two medians taken side by side: new
  questions of one template ("Unrelated question <id> about topic <n>?": after the first, each
  shares words with those cached before it), new topics (words no cached question has, drawn
  from the repository's written question sets: raced from the start with `race_unrelated`; also
  streamed, timed to the first content chunk), and the same in a new conversation (earlier turns never seen: an empty namespace, no embedding).
  With `--paraphrases`, each turn also asks a new rewording of a stored question ("How can I
  ...?" for "How do I ...?"): hits that embed, so that new questions often find an answer and
  `race_rare_hits` no longer races them. With `--burst-paraphrases`, the concurrent clients ask
  new rewordings too, each text once per gateway, so every hit embeds its question and judges its
  candidates even with the vector memo on (a long one, two sentences sharing the second with the
  stored ones, embeds its first sentence only: `semantic_cache.context_groups`).

All configurations run at once and are measured in rotating turns (`--rounds`), so the load of
the shared machine falls on each alike; the figures are medians over rounds.

    python -m loadtests.semantic_throughput [--configs 1x1,1x8,2x1,2x8] [--rounds 3]
        [--profile zero-latency|low-latency]

Only 127.0.0.1; stops by itself. The clients run on the same machine as the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import aiohttp
import orjson

from loadtests.overhead import baseline_tree
from loadtests.processes import gateway_process
from loadtests.scrape import metric_sum, metrics_of
from loadtests.simulator.testing import spawn_fleet

POLICY = """
providers:
  zero: {{base_url: '{url}', max_inflight: 4096}}
pools:
  main: {{members: [zero]}}
semantic_cache: {{workers: {workers}, batch_max: {batch}, vector_memo: {memo}, queue_max: 1024,
                 lookup_budget_ms: {budget}, embedder: {embedder}{race}}}
models:
  sem: {{pool: main, cache: {{exact: {{enabled: false}}, semantic: {{enabled: true{race_all}}}}}}}
  plain: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
"""
VERBS = ["reset", "back up", "recover", "update", "sync", "move", "share", "encrypt"]
THINGS = ["photos", "password", "contacts", "calendar", "notes", "messages", "music", "files"]
PLACES = ["iPhone", "Android phone", "Windows laptop", "Mac", "iPad", "Chromebook"]
LONG_TAIL = (
    " I tried the settings menu and the official help pages but nothing worked, and I do not"
    " want to lose anything"
)


def questions(n: int, long: bool) -> list[str]:
    out = []
    for i in range(n):
        q = (
            f"How do I {VERBS[i % len(VERBS)]} my {THINGS[(i // 8) % len(THINGS)]} on my "
            f"{PLACES[(i // 64) % len(PLACES)]} safely?"
        )
        out.append(q[:-1] + "?" + LONG_TAIL + "?" if long else q)
    return out


def paraphrases(texts: list[str], long: bool = False) -> list[str]:
    """New rewordings of `texts` (each a hit for the verifier), shuffled (seeded). Long ones
    take other forms than short ones: their first sentence, which the cache judges apart (the
    long questions share their second), must not be a short paraphrase asked before, whose
    vector the memo would hold."""
    forms = (
        ("What's the best way to ", "How would I ", "Tell me how to ")
        if long
        else ("How can I ", "What is the way to ", "How should I ")
    )
    out = [form + t.removeprefix("How do I ") for t in texts for form in forms]
    random.Random(11).shuffle(out)
    return out


#: Other endings for "... safely?" that keep the question (`paraphrases` keeps the original
#: one): with these forms, enough distinct rewordings for 16 clients to ask a new one every time
#: for seconds (`--burst-paraphrases`; a pool used up falls back to the stored questions).
ENDINGS = (
    " safely, please?", " in a safe way?", " without any risk?", " safely, thanks?",
    " safely and easily?", " in a secure way?", " safely, if possible?", " safely please?",
    " the safe way?", " without risk?", " safely today?",
)  # fmt: skip
BURST_FORMS = (
    "How can I ", "What is the way to ", "How should I ", "What's the best way to ",
    "How would I ", "Tell me how to ",
)  # fmt: skip


def many_paraphrases(texts: list[str]) -> list[str]:
    """Distinct rewordings of `texts`, never one `paraphrases` gives, shuffled (seeded)."""
    out = [
        form + t.removeprefix("How do I ").replace(" safely?", end, 1)
        for t in texts
        for form in BURST_FORMS
        for end in ENDINGS
    ]
    random.Random(13).shuffle(out)
    return out


def topic_words() -> list[str]:
    """Distinct longer words of the repository's written question sets, shuffled (seeded)."""
    words: set[str] = set()
    for path in sorted((Path(__file__).parent / "data" / "written").glob("*.tsv")):
        words.update(re.findall(r"\b[a-z]{7,}\b", path.read_text().lower()))
    out = sorted(words)
    random.Random(7).shuffle(out)
    return out


def body(model: str, text: str, earlier: str | None = None, stream: bool = False) -> bytes:
    msg = [{"role": "user", "content": text}]
    if earlier is not None:  # a conversation: its earlier turns make its own namespace
        msg = [
            {"role": "user", "content": earlier},
            {"role": "assistant", "content": "Sure."},
            *msg,
        ]
    doc = {"model": model, "messages": msg, "temperature": 0, "max_tokens": 8}
    return orjson.dumps({**doc, "stream": True} if stream else doc)


async def post(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[float, str]:
    t = time.perf_counter()
    async with session.post(url, data=data, headers={"content-type": "application/json"}) as r:
        await r.read()
        assert r.status == 200, r.status
        return time.perf_counter() - t, r.headers.get("x-gateway-cache", "")


async def first_token(session: aiohttp.ClientSession, url: str, data: bytes) -> float:
    """Seconds to a stream's first chunk carrying content (the rest is read, not timed)."""
    t = time.perf_counter()
    took = None
    async with session.post(url, data=data, headers={"content-type": "application/json"}) as r:
        assert r.status == 200, r.status
        async for line in r.content:
            if took is None and line.startswith(b"data: {") and b'"content":"' in line:
                took = time.perf_counter() - t
    assert took is not None, "no content chunk"
    return took


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


async def warm(gw: str, texts: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        for t in texts:  # store every question
            await post(s, gw + "/chat/completions", body("sem", t))


async def burst(
    gw: str,
    texts: list[str],
    clients: int,
    seconds: float,
    topics: list[str],
    reworded: list[str] | None = None,
    burst_texts: list[str] | None = None,
) -> dict[str, float]:
    """One client's hits and misses (semantic on / off, interleaved), then `clients` at once.
    `topics`: words never asked before (three are taken per new-topic question); `reworded`:
    new paraphrases of stored questions (one asked per turn), or None; `burst_texts`: what the
    clients ask, each text once (taken from the end), instead of the stored questions."""
    url = gw + "/chat/completions"
    conn = aiohttp.TCPConnector(limit=clients + 2)
    async with aiohttp.ClientSession(connector=conn) as s:
        one_hit, miss_sem, miss_plain, miss_conv, miss_conv_plain = [], [], [], [], []
        miss_topic, miss_topic_plain, ttft_topic, ttft_topic_plain = [], [], [], []
        para: list[tuple[float, str]] = []
        for i in range(20):
            if reworded is not None:
                para.append(await post(s, url, body("sem", reworded.pop())))
            a, b, c = topics.pop(), topics.pop(), topics.pop()
            t = f"Tell me about {a}, {b} and {c}."
            miss_topic.append((await post(s, url, body("sem", t)))[0])
            miss_topic_plain.append((await post(s, url, body("plain", t + " plain")))[0])
            a, b, c = topics.pop(), topics.pop(), topics.pop()
            t = f"Tell me about {a}, {b} and {c}."
            ttft_topic.append(await first_token(s, url, body("sem", t, stream=True)))
            ttft_topic_plain.append(
                await first_token(s, url, body("plain", t + " plain", stream=True))
            )
            one_hit.append((await post(s, url, body("sem", texts[i * 5 % len(texts)])))[0])
            q = f"Unrelated question {uuid.uuid4().hex[:8]} about topic {i}?"
            miss_sem.append((await post(s, url, body("sem", q)))[0])
            miss_plain.append((await post(s, url, body("plain", q + " plain")))[0])
            first = f"Let us talk about case {uuid.uuid4().hex[:8]}."
            miss_conv.append((await post(s, url, body("sem", q, first)))[0])
            miss_conv_plain.append((await post(s, url, body("plain", q, first + " p")))[0])
        lat: list[float] = []
        kinds: dict[str, int] = {}
        stop = time.perf_counter() + seconds

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < stop:
                text = burst_texts.pop() if burst_texts else texts[i % len(texts)]
                d, kind = await post(s, url, body("sem", text))
                lat.append(d)
                kinds[kind] = kinds.get(kind, 0) + 1
                i += clients

        # The gateway's CPU time per request: what a change to the work per request moves
        # (the two scrapes cost ~1 ms each).
        cpu0 = metric_sum(metrics_of(gw), "process_cpu_seconds_total")
        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed = time.perf_counter() - t0
        cpu = metric_sum(metrics_of(gw), "process_cpu_seconds_total") - cpu0
    hits = kinds.get("hit-semantic", 0)
    extra = {}
    if para:
        extra["para_hit_p50_ms"] = statistics.median(d for d, _ in para) * 1000
        extra["para_served"] = sum(k == "hit-semantic" for _, k in para) / len(para)
    return {
        **extra,
        "hits_per_s": hits / elapsed,
        "cpu_ms_per_req": 1000 * cpu / max(1, len(lat)),
        "served_share": hits / max(1, len(lat)),
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "one_hit_p50_ms": statistics.median(one_hit) * 1000,
        "miss_sem_p50_ms": statistics.median(miss_sem) * 1000,
        "miss_plain_p50_ms": statistics.median(miss_plain) * 1000,
        "miss_conv_p50_ms": statistics.median(miss_conv) * 1000,
        "miss_conv_plain_p50_ms": statistics.median(miss_conv_plain) * 1000,
        "miss_topic_p50_ms": statistics.median(miss_topic) * 1000,
        "miss_topic_plain_p50_ms": statistics.median(miss_topic_plain) * 1000,
        "ttft_topic_p50_ms": statistics.median(ttft_topic) * 1000,
        "ttft_topic_plain_p50_ms": statistics.median(ttft_topic_plain) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configs",
        default="1x1,1x8,2x1,2x8",
        help="WORKERSxBATCH, optional m (vector memo on), bMS (lookup budget), w (race_unrelated"
        " off), r (race_rare_hits: 0; w and r: every lookup waited for), a (the semantic alias races every lookup: race_all) and p"
        " (the packaged model instead of its int8 build), e.g. 1x8mb5, 2x8mw, 2x8ma, 2x8p",
    )
    ap.add_argument("--lengths", default="short,long")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument(
        "--profile",
        default="zero-latency",
        help="simulated upstream (loadtests/profiles.yaml); low-latency: ~120 ms for 8 tokens",
    )
    ap.add_argument("--seconds", type=float, default=2.0, help="per burst")
    ap.add_argument("--rounds", type=int, default=3, help="bursts per configuration, interleaved")
    ap.add_argument("--questions", type=int, default=128)
    ap.add_argument(
        "--paraphrases",
        action="store_true",
        help="each turn also asks a new paraphrase of a stored question (a hit that embeds)",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        help="another commit: each configuration also runs on its gateway (CONFIG@base), in the "
        "same rotation",
    )
    ap.add_argument(
        "--burst-paraphrases",
        action="store_true",
        help="the concurrent clients ask new rewordings of the stored questions, each once, "
        "instead of the questions themselves (hits that embed and judge, memo or not)",
    )
    args = ap.parse_args()
    configs = args.configs.split(",")
    if args.baseline:
        configs += [f"{c}@base" for c in configs]
    lengths = args.lengths.split(",")
    texts = {length: questions(args.questions, length == "long") for length in lengths}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    peak_rss: dict[str, float] = {}  # per gateway process, after each round
    upstream = [{"name": "zero", "profile": args.profile}]
    with spawn_fleet(upstream) as fleet, ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="sem-throughput-"))
        base = stack.enter_context(baseline_tree(args.baseline)) if args.baseline else None
        gateways = {}
        for config in configs:  # all running at once, measured in turn: the same machine noise
            m = re.fullmatch(r"(\d+)x(\d+)(m?)(?:b(\d+))?(w?)(r?)(a?)(p?)(@base)?", config)
            assert m, f"bad configuration {config!r}: WORKERSxBATCH[m][bMS][w][r][a][p]"
            policy = folder / f"policy-{config.replace('@', '-')}.yaml"
            policy.write_text(
                POLICY.format(
                    url=fleet.url("zero"),
                    workers=m[1],
                    batch=m[2],
                    memo=4096 if m[3] else 0,
                    budget=m[4] or 0,
                    embedder="onnx-packaged" if m[8] else "auto",
                    race=(", race_unrelated: false" if m[5] else "")
                    + (", race_rare_hits: 0" if m[6] else ""),
                    race_all=", race_all: true" if m[7] else "",
                )
            )
            env = {"GATEWAY_ACCESS_LOG": "0"}
            root = base if m[9] else None
            gateways[config] = stack.enter_context(gateway_process(policy, env=env, root=root))
        for gw in gateways.values():
            for length in lengths:
                asyncio.run(warm(gw, texts[length]))
        reworded = {
            (config, length): paraphrases(texts[length], length == "long")
            if args.paraphrases
            else None
            for config in configs
            for length in lengths
        }
        # One pool per gateway and length: no text is asked twice of one gateway (its memo).
        bursts = {
            (config, length): many_paraphrases(texts[length]) if args.burst_paraphrases else None
            for config in configs
            for length in lengths
        }
        topics = topic_words()
        need = 120 * args.rounds * len(configs) * len(lengths)
        assert len(topics) >= need, f"{len(topics)} topic words, {need} needed: fewer rounds"
        for r in range(args.rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]  # rotate
            for config in order:
                for length in lengths:
                    res = asyncio.run(
                        burst(
                            gateways[config],
                            texts[length],
                            args.clients,
                            args.seconds,
                            topics,
                            reworded[config, length],
                            bursts[config, length],
                        )
                    )
                    if bursts[config, length] is not None:
                        res["burst_texts_left"] = len(bursts[config, length] or [])
                    runs.setdefault((config, length), []).append(res)
                    print(r, config, length, {k: round(v, 1) for k, v in res.items()}, flush=True)
            for config, gw in gateways.items():  # upstream calls started for late lookups
                text = metrics_of(gw)
                counts = {
                    outcome: metric_sum(text, "gateway_semantic_lookups_total", outcome=outcome)
                    for outcome in ("hit", "early", "late", "late_hit_raced")
                }
                rss = metric_sum(text, "process_resident_memory_bytes") / 2**20
                peak_rss[config] = max(peak_rss.get(config, 0.0), rss)
                print(f"{config}: lookups {counts} (late_hit_raced = upstream calls cancelled),"
                      f" RSS {rss:.0f} MB")  # fmt: skip
    rows = [
        (config, length, {k: statistics.median(x[k] for x in runs[config, length])
                          for k in runs[config, length][0]})
        for config in configs
        for length in lengths
    ]  # fmt: skip
    print("\nGateway RSS after the rounds (MB, the highest seen): "
          + ", ".join(f"{c} {v:.0f}" for c, v in peak_rss.items()))  # fmt: skip
    print("\n| workers x batch | questions | hits/s (16 clients) | p50 / p99 ms "
          "| gateway CPU ms per request | one-client hit "
          "p50 ms | miss p50: semantic on / off ms | miss, new topic: on / off ms "
          "| streamed, new topic: first token on / off ms "
          "| miss in a new conversation: on / off ms | served |"
          + (" paraphrase hit p50 ms | paraphrases served |" if args.paraphrases else ""))  # fmt: skip
    print(
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.paraphrases else "")
    )
    for config, length, row in rows:
        para = (
            f" {row['para_hit_p50_ms']:.1f} | {row['para_served']:.0%} |"
            if args.paraphrases
            else ""
        )
        print(
            f"| {config} | {length} | {row['hits_per_s']:.0f} | {row['p50_ms']:.1f} / "
            f"{row['p99_ms']:.1f} | {row['cpu_ms_per_req']:.2f} | {row['one_hit_p50_ms']:.1f} | "
            f"{row['miss_sem_p50_ms']:.1f} / "
            f"{row['miss_plain_p50_ms']:.1f} | {row['miss_topic_p50_ms']:.1f} / "
            f"{row['miss_topic_plain_p50_ms']:.1f} | {row['ttft_topic_p50_ms']:.1f} / "
            f"{row['ttft_topic_plain_p50_ms']:.1f} | {row['miss_conv_p50_ms']:.1f} / "
            f"{row['miss_conv_plain_p50_ms']:.1f} | {row['served_share']:.0%} |{para}"
        )


if __name__ == "__main__":
    main()
