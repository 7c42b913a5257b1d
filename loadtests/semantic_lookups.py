"""Semantic cache lookups a second in-process, this tree against another commit's.

    python -m loadtests.semantic_lookups [--baseline REV] [--rounds 3] [--seconds 3]

`SemanticCache.lookup` alone (no HTTP, no gateway): the throughput benchmark's 128 questions
(~15 and ~36 tokens) are stored in one namespace, then 16 concurrent callers ask them again
verbatim for `--seconds` (vector memo on, the default: every lookup a memo hit, a search and the
verbatim rule). Each measurement runs in its own process; with `--baseline` the same in
another commit's tree, alternating, so a change to the lookup's own path shows without the
HTTP benchmark's noise (±15% between rounds here). Medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def measure(length: str, seconds: float) -> float:
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings
    from loadtests.semantic_throughput import questions

    cache = SemanticCache(SemanticSettings(workers=2, batch_max=8))
    namespace = "tenant\x1fsem\x1fbench"
    texts = questions(128, length == "long")
    try:
        for text in texts:
            found = await cache.lookup(namespace, text)
            await cache.store(namespace, text, b"{}", vector=found.vector)
        done = 0
        stop = time.perf_counter() + seconds

        async def caller(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < stop:
                found = await cache.lookup(namespace, texts[i % len(texts)])
                assert found.outcome == "hit", found
                done += 1
                i += 16

        await asyncio.gather(*(caller(k) for k in range(16)))
        return done / seconds
    finally:
        await cache.aclose()


def run_in(tree: Path, length: str, seconds: float) -> float:
    """One measurement in a fresh process importing the gateway (and the benchmark's questions)
    from `tree`: this file runs by its path, so an older tree need not have it."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure", length, "--seconds", str(seconds)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=None, help="another commit, measured alternately")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--measure", choices=["short", "long"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:  # one measurement, in the process `run_in` started
        print(asyncio.run(measure(args.measure, args.seconds)))
        return
    with ExitStack() as stack:
        trees = {"this tree": ROOT}
        if args.baseline:
            from loadtests.overhead import baseline_tree

            trees[args.baseline] = stack.enter_context(baseline_tree(args.baseline))
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for length in ("short", "long"):
                for name, tree in trees.items():
                    rate = run_in(tree, length, args.seconds)
                    results.setdefault((name, length), []).append(rate)
                    print(r, name, length, f"{rate:.0f} lookups/s", flush=True)
    print("\n| tree | questions | verbatim lookups/s, 16 callers (median) | rounds |")
    print("|---|---|---|---|")
    for (name, length), rates in results.items():
        each = ", ".join(f"{x:.0f}" for x in rates)
        print(f"| {name} | {length} | {statistics.median(rates):.0f} | {each} |")


if __name__ == "__main__":
    main()
