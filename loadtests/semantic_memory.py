"""RSS of the semantic cache with one entry per namespace (every conversation is a namespace).

Loads the embedding model, measures RSS, then stores N entries in N namespaces through
`SemanticCache.store` (vectors given, so the model is not run: this measures the cache, not the
embedder) and measures RSS again. The cache must stay within `max_bytes` plus the model.

    python -m loadtests.semantic_memory [--entries 100000] [--max-mb 512] [--response-bytes 500]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--max-mb", type=int, default=512)
    ap.add_argument("--response-bytes", type=int, default=500)
    args = ap.parse_args()
    out = asyncio.run(run(args))
    for k, v in out.items():
        print(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}")
    within = out["rss_growth_mb"] <= out["max_mb"]
    print(f"RSS growth within max_bytes: {'yes' if within else 'NO'}")


if __name__ == "__main__":
    main()
