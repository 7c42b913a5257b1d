"""RSS of the semantic cache with one entry per namespace (every conversation is a namespace).

Loads the embedding model, measures RSS, then stores N entries in N namespaces through
`SemanticCache.store` (vectors given, so the model is not run: this measures the cache, not the
embedder) and measures RSS again. The cache must stay within `max_bytes` plus the model.

    python -m loadtests.semantic_memory [--entries 100000] [--max-mb 512] [--response-bytes 500]

`--http`: the same through the real gateway (`gateway serve` as its own process, the simulated
upstream on loopback, default semantic settings but `max_bytes`): N chat requests, each its own
conversation (a system prompt of its own) and a question of its own, from 16 clients, each a
refresh (`Cache-Control: no-cache`: its store waits for the embedder instead of being refused
when the queue is full); every one is answered upstream, embedded and stored. The gateway's RSS
(`/metrics`) is read after a warm-up that loads the model and again at the end, with what the
cache counted. `--long` adds a sentence of context to each question and asks eight of them in each
conversation: their entries then keep two clause vectors each for the groups of shared context
(`gateway/cache/context_index.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def run(args: argparse.Namespace) -> dict[str, float]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gateway.cache.semantic import SemanticCache, namespace_for
    from gateway.cache.semantic_settings import SemanticSettings

    settings = SemanticSettings(max_bytes=args.max_mb * 1024 * 1024, max_entries=10**7)
    cache = SemanticCache(settings)
    await cache.worker.embed(["warm up"])
    gc.collect()
    base = rss_mb()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    chunk = 1000
    for start in range(0, args.entries, chunk):
        vecs = rng.standard_normal((chunk, cache.worker.dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        jobs = []
        for j in range(chunk):
            i = start + j
            messages = [
                {"role": "user", "content": f"conversation {i} first turn"},
                {"role": "user", "content": "q"},
            ]
            ns = namespace_for("tenant", "chat", messages)
            text = f"What is the best way to handle case number {i} in my project?"
            body = (b'{"choices":[{"message":{"content":"' + bytes(args.response_bytes)
                    + b'"}}]}')  # fmt: skip
            jobs.append(cache.store(ns, text, body, vector=vecs[j], wait_s=30.0))
        await asyncio.gather(*jobs)
    elapsed = time.perf_counter() - t0
    gc.collect()
    after = rss_mb()
    st = cache.stats()
    await cache.aclose()
    return {
        "entries_stored": st["entries"],
        "namespaces": st["namespaces"],
        "evicted": st["evicted"],
        "counted_mb": st["bytes"] / 2**20,
        "max_mb": args.max_mb,
        "rss_model_mb": base,
        "rss_after_mb": after,
        "rss_growth_mb": after - base,
        "store_s": elapsed,
    }


HTTP_POLICY = """
providers:
  zero: {{base_url: '{url}', max_inflight: 4096}}
pools:
  main: {{members: [zero]}}
semantic_cache: {{max_bytes: {max_bytes}}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}, semantic: {{enabled: true}}}}}}
"""


#: `--long`: the question then a sentence of context, so that each entry joins two groups of
#: shared context (two clause vectors more, counted against max_bytes).
LONG_TAIL = " I ordered it last week and the tracking page has not changed since Monday."


async def _ask_all(base_url: str, first: int, count: int, clients: int, tail: str = "") -> None:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as s:
        next_i = first

        async def client() -> None:
            nonlocal next_i
            # --long: eight questions a conversation, so that its entries do join groups
            per = 8 if tail else 1
            while next_i < first + count:
                i, next_i = next_i, next_i + 1
                body = {
                    "model": "chat",
                    "temperature": 0,
                    "max_tokens": 8,
                    "messages": [
                        {
                            "role": "system",
                            "content": f"You help the customer of order {i // per}.",
                        },
                        {
                            "role": "user",
                            "content": f"Where is my parcel number {i} right now?{tail}",
                        },
                    ],
                }
                # A refresh waits for its store: a new conversation has nothing to look up, so
                # it goes upstream at once, faster than its question is embedded, and a burst of
                # plain requests would see most stores refused (counted) once the queue is full.
                headers = {"cache-control": "no-cache"}
                async with s.post(base_url + "/chat/completions", json=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"request {i}: HTTP {r.status}")

        await asyncio.gather(*(client() for _ in range(clients)))


def run_http(args: argparse.Namespace) -> dict[str, float]:
    import tempfile
    from pathlib import Path

    from loadtests.processes import gateway_process
    from loadtests.scrape import metric_sum, metrics_of
    from loadtests.simulator.testing import spawn_fleet

    folder = Path(tempfile.mkdtemp(prefix="sem-memory-"))
    policy = folder / "policy.yaml"
    with spawn_fleet([{"name": "zero", "profile": "zero-latency"}]) as fleet:
        policy.write_text(HTTP_POLICY.format(url=fleet.url("zero"), max_bytes=args.max_mb << 20))
        with gateway_process(policy, env={"GATEWAY_ACCESS_LOG": "0"}) as gw:
            tail = LONG_TAIL if args.long else ""
            asyncio.run(_ask_all(gw, 0, 500, args.clients, tail))  # the model loaded and warm
            before = metrics_of(gw)
            t0 = time.perf_counter()
            asyncio.run(_ask_all(gw, 500, args.entries, args.clients, tail))
            elapsed = time.perf_counter() - t0
            time.sleep(1.0)  # the last stores land
            after = metrics_of(gw)
    rss = "process_resident_memory_bytes"
    base, end = metric_sum(before, rss) / 2**20, metric_sum(after, rss) / 2**20
    size = "gateway_semantic_cache_size"
    return {
        "requests": args.entries,
        "entries_stored": int(metric_sum(after, size, what="entries")),
        "namespaces": int(metric_sum(after, size, what="namespaces")),
        "evicted": int(metric_sum(after, "gateway_semantic_removed_total", reason="evicted")),
        "refused": int(metric_sum(after, "gateway_semantic_stores_total", outcome="refused")),
        "counted_mb": metric_sum(after, size, what="bytes") / 2**20,
        "max_mb": args.max_mb,
        "rss_model_mb": base,
        "rss_after_mb": end,
        "rss_growth_mb": end - base,
        "requests_per_s": args.entries / elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--max-mb", type=int, default=512)
    ap.add_argument("--response-bytes", type=int, default=500)
    ap.add_argument("--http", action="store_true", help="through a `gateway serve` process")
    ap.add_argument("--clients", type=int, default=16, help="--http: concurrent clients")
    ap.add_argument(
        "--long",
        action="store_true",
        help="--http: questions of two clauses, eight a conversation (entries in groups of "
        "shared context)",
    )
    args = ap.parse_args()
    out = run_http(args) if args.http else asyncio.run(run(args))
    for k, v in out.items():
        print(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}")
    within = out["rss_growth_mb"] <= out["max_mb"]
    print(f"RSS growth within max_bytes: {'yes' if within else 'NO'}")


if __name__ == "__main__":
    main()
