"""A lone model call on one core or on two, in-process: what `SoloChoice` chooses between.

    python -m loadtests.solo_embedding [--calls 60] [--cores 2]

1. The int8 embedder's one-core session against its `on_cores` session, one 15-token question
   a call, after each idle gap (the process sleeping in between, as a lone client's requests
   leave it), the two alternating by gap; then the same while another process keeps one core
   busy (a spinning loop).
2. `AsyncEmbedder` as the gateway runs it (two threads), with and without the solo session (and
   `SoloChoice` deciding), one question at a time at each pause: p50 / p90 and the share of
   calls that ran on several cores.

Only this process and the spinning one; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from gateway.cache.async_embedder import AsyncEmbedder
from gateway.cache.embedder import OnnxEmbedder, make_embedders, solo_embedder

QUESTION = "How do I negotiate a higher salary after receiving a job offer?"
GAPS_MS = (1, 4, 7, 8, 10, 20, 50)
PAUSES_MS = (2, 5, 10, 20)


def _ms(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return 1e3 * statistics.median(xs), 1e3 * xs[int(0.9 * (len(xs) - 1))]


def timed(embed: Callable[[list[str]], object], gap_s: float, calls: int) -> list[float]:
    out = []
    for i in range(calls):
        time.sleep(gap_s)
        t = time.perf_counter()
        embed([f"{QUESTION} ({i})"])
        out.append(time.perf_counter() - t)
    return out


def raw(calls: int, cores: int) -> None:
    one = OnnxEmbedder()
    many = one.on_cores(cores)
    for e in (one, many):
        e.embed([QUESTION])
    print(f"| idle before the call | one core p50 / p90 ms | {cores} cores p50 / p90 ms |")
    print("|---|---|---|")
    for gap in GAPS_MS:
        a = _ms(timed(one.embed, gap / 1e3, calls))
        b = _ms(timed(many.embed, gap / 1e3, calls))
        print(f"| {gap} ms | {a[0]:.2f} / {a[1]:.2f} | {b[0]:.2f} / {b[1]:.2f} |")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        for gap in (1, 20):
            a = _ms(timed(one.embed, gap / 1e3, calls))
            b = _ms(timed(many.embed, gap / 1e3, calls))
            print(
                f"| {gap} ms, another process spinning | {a[0]:.2f} / {a[1]:.2f} | "
                f"{b[0]:.2f} / {b[1]:.2f} |"
            )
    finally:
        spin.kill()
        spin.wait()


async def through_worker(calls: int, cores: int) -> None:
    embedders = make_embedders("auto", 2)
    print(
        "\n| pause between lookups | two threads p50 / p90 ms | with solo p50 / p90 ms "
        "| solo share |"
    )
    print("|---|---|---|---|")
    for pause in PAUSES_MS:
        row = []
        for solo in (None, solo_embedder(embedders[0], cores)):
            w = AsyncEmbedder(embedders, 8, 256, memo=0, solo=solo)
            try:
                out = []
                for i in range(4 * calls):
                    await asyncio.sleep(pause / 1e3)
                    t = time.perf_counter()
                    await w.embed([f"{QUESTION} [{pause}-{i}]"])
                    out.append(time.perf_counter() - t)
                row.append((_ms(out[calls:]), w.solo_texts / len(out)))  # after learning
            finally:
                w.close()
        (a, _), (b, share) = row
        print(f"| {pause} ms | {a[0]:.2f} / {a[1]:.2f} | {b[0]:.2f} / {b[1]:.2f} | {share:.0%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    raw(args.calls, args.cores)
    asyncio.run(through_worker(args.calls, args.cores))


if __name__ == "__main__":
    main()
