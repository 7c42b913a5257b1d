"""Cost of the semantic cache: lookup latency, memory per entry, rebuild time from Redis.

    python -m loadtests.semantic_speed [--embedders onnx,torch] [--sizes 1000,10000,100000]

Lookup = embed + FAISS search + verifier, measured through `SemanticCache.lookup` one at a time
(p50/p99), and with 8 concurrent callers (micro-batched throughput). Namespaces are filled with
random unit vectors: an exact search costs the same whatever the vectors are, and embedding
100k texts would take minutes. Memory: RSS delta and index bytes after 100k entries (500-byte
responses). Rebuild: 100k entries written to Redis db 9, read back by a fresh cache; the db is
flushed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import orjson
from redis.asyncio import Redis

from gateway.cache.async_embedder import AsyncEmbedder
from gateway.cache.embedder import make_embedder
from gateway.cache.semantic import SemanticCache, entry_id_for
from gateway.cache.semantic_index import Entry
from gateway.cache.semantic_settings import SemanticSettings
from gateway.cache.semantic_store import encode_entry

NS = "bench\x1fmodel\x1fctx"
QUERIES = [
    "How do I reset my password?", "What's the weather like in Paris in July?",
    "How many calories are in 2 eggs?", "Is Python faster than Java?",
    "How do I install Docker on Ubuntu?", "Can dogs eat chocolate?",
    "What is the boiling point of water?", "How far is Berlin from Munich?",
]  # fmt: skip
RESPONSE = b"x" * 500


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def fake_entries(n: int, dim: int, seed: int = 0) -> list[Entry]:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, dim), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    exp = time.time() + 3600
    return [
        Entry(  # own vector and response per entry, as entries stored by requests have
            entry_id_for(NS, f"q{i}"),
            NS,
            f"synthetic question number {i}?",
            vecs[i].copy(),
            RESPONSE[:-1] + b"%d" % (i % 10),
            exp,
        )
        for i in range(n)
    ]


async def fill(cache: SemanticCache, entries: list[Entry]) -> None:
    def add() -> None:
        now = time.time()
        for e in entries:
            cache.index.add(e, now)

    await cache.worker.call(add)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


async def lookup_latency(cache: SemanticCache, rounds: int) -> dict[str, float]:
    for q in QUERIES:  # warm up
        await cache.lookup(NS, q)
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        await cache.lookup(NS, QUERIES[i % len(QUERIES)] + f" ({i})")
        times.append((time.perf_counter() - t0) * 1000)
    conc, n_conc = 8, rounds
    t0 = time.perf_counter()
    for i in range(0, n_conc, conc):
        await asyncio.gather(*(cache.lookup(NS, f"{QUERIES[j % 8]} #{i + j}") for j in range(conc)))
    per_s = n_conc / (time.perf_counter() - t0)
    return {"p50_ms": pct(times, 50), "p99_ms": pct(times, 99),
            "mean_ms": statistics.fmean(times), "concurrent8_lookups_per_s": per_s}  # fmt: skip


async def bench_embedder(kind: str, sizes: list[int], rounds: int) -> dict:
    rss0 = rss_mb()
    worker = AsyncEmbedder(make_embedder(kind), memo=0)  # type: ignore[arg-type]  # embed each time
    out: dict = {"embedder": worker.embedder.name, "model_rss_mb": rss_mb() - rss0, "sizes": {}}
    for n in sizes:
        cache = SemanticCache(SemanticSettings(max_entries=max(sizes) + 10), worker=worker)
        await fill(cache, fake_entries(n, worker.dim))
        out["sizes"][n] = await lookup_latency(cache, rounds)
        print(kind, n, out["sizes"][n], flush=True)
        del cache
    worker.close()
    return out


async def bench_memory_and_rebuild(n: int, redis_url: str) -> dict:
    worker = AsyncEmbedder(make_embedder("auto"), memo=0)
    settings = SemanticSettings(
        max_entries=n + 10, redis_prefix="bench:sem:", redis_channel="bench:sem:new"
    )
    rss0 = rss_mb()  # before the entries exist: their vectors and responses count
    entries = fake_entries(n, worker.dim, seed=1)
    cache = SemanticCache(settings, worker=worker)
    await fill(cache, entries)
    mem = {"entries": len(cache.index), "rss_delta_mb": rss_mb() - rss0,
           "index_matrix_mb": cache.index.index_bytes / 2**20,
           "accounted_mb": cache.index.nbytes / 2**20}  # fmt: skip
    model_id = cache.worker.embedder.model_id
    del cache
    redis = Redis.from_url(redis_url)
    await redis.flushdb()
    t0 = time.perf_counter()
    for i in range(0, n, 2000):
        async with redis.pipeline(transaction=False) as pipe:
            for e in entries[i : i + 2000]:
                pipe.set(
                    settings.redis_prefix + e.entry_id, encode_entry(e, model_id, "bench"), ex=3600
                )
            await pipe.execute()
    write_s = time.perf_counter() - t0
    redis_mb = (await redis.info("memory"))["used_memory"] / 2**20
    fresh = SemanticCache(settings, redis=redis, worker=worker)
    t0 = time.perf_counter()
    loaded = await fresh.rebuild_from_redis()
    rebuild_s = time.perf_counter() - t0
    indexed = len(fresh.index)
    await redis.flushdb()
    await redis.aclose()
    worker.close()
    return {"memory": mem, "redis_write_s": write_s, "redis_used_mb": redis_mb,
            "rebuild_s": rebuild_s, "rebuilt_entries": loaded, "indexed": indexed}  # fmt: skip


def render(results: dict) -> str:
    lines = ["# Semantic cache speed\n",
             "| embedder | entries | p50 ms | p99 ms | 8 concurrent, lookups/s |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in results["lookup"]:
        for n, s in r["sizes"].items():
            lines.append(f"| {r['embedder']} | {n} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} "
                         f"| {s['concurrent8_lookups_per_s']:.0f} |")  # fmt: skip
    lines += [
        "\nModel RSS: "
        + ", ".join(f"{r['embedder']} {r['model_rss_mb']:.0f} MB" for r in results["lookup"])
    ]
    if "rebuild" in results:
        rb = results["rebuild"]
        m = rb["memory"]
        lines += [
            f"\nMemory for {m['entries']} entries (500-byte responses): "
            f"RSS +{m['rss_delta_mb']:.0f} MB, "
            f"vector matrix {m['index_matrix_mb']:.0f} MB, accounted {m['accounted_mb']:.0f} MB.",
            f"\nRedis: {rb['rebuilt_entries']} entries written in {rb['redis_write_s']:.1f} s "
            f"(Redis used {rb['redis_used_mb']:.0f} MB); rebuild (SCAN+MGET+decode+index) "
            f"{rb['rebuild_s']:.2f} s; entries in the index after rebuild: {rb['indexed']}.",
        ]
    lines.append(f"\nLoad average (1 min) at the end: {results['loadavg_1m_at_end']:.2f}.")
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict = {"lookup": []}
    for kind in args.embedders.split(","):
        results["lookup"].append(await bench_embedder(kind, sizes, args.rounds))
    if args.rebuild:
        results["rebuild"] = await bench_memory_and_rebuild(args.rebuild, args.redis_url)
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["loadavg_1m_at_end"] = os.getloadavg()[0]  # other processes skew the latencies
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedders", default="onnx,torch")
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--rebuild", type=int, default=100_000, help="entries (0: skip)")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    ap.add_argument("--out-dir", default=str(Path(__file__).parent / "data" / "results"))
    args = ap.parse_args()
    results = asyncio.run(main_async(args))
    md = render(results)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "semantic_speed.md").write_text(md, encoding="utf-8")
    (out / "semantic_speed.json").write_bytes(
        orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    print(md)


if __name__ == "__main__":
    main()
