"""One lookup at a time, in-process: how long a first rewording of a stored question takes.

    python -m loadtests.semantic_lookup_latency [--questions 60] [--pause-ms 50] [--ab]

A `SemanticCache` at the default settings (two embedding threads, the vector memo on) stores
the 128 questions of `semantic_throughput` one at a time (as a gateway stores misses, with its
threads idle in between), then asks one new rewording of each of the first `--questions` of
them, one at a time with a pause between (a lone client), each rewording of another stored
question: the first paraphrase of a stored question, which the HTTP benchmark's one-client
phase rarely sees (its rewordings reuse what earlier ones embedded). Prints the p50 / p90 of the
lookups and their outcomes, for short and long (two-sentence) questions. No HTTP, no Redis.
`--ab`: each also with `context_groups: false` (the whole text embedded for every lookup), the
two alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from gateway.cache.semantic import SemanticCache
from gateway.cache.semantic_settings import SemanticSettings
from loadtests.semantic_throughput import paraphrases, questions


async def run(
    long: bool, count: int, pause_s: float, groups: bool = True
) -> tuple[list[float], dict[str, int]]:
    cache = SemanticCache(SemanticSettings(context_groups=groups))
    await cache.start()
    try:
        stored = questions(128, long)
        for text in stored:
            await cache.store("ns", text, b"answer", wait_s=5)
            await asyncio.sleep(0.005)  # as between a gateway's misses: the threads idle
        # one rewording of each stored question (the forms repeat every 128)
        asked = paraphrases(stored, long)[: 5 + count]
        for text in asked[:5]:  # warm-up: the model's first calls are slower
            await cache.lookup("ns", text)
        times: list[float] = []
        outcomes: dict[str, int] = {}
        for text in asked[5:]:
            await asyncio.sleep(pause_s)
            t0 = time.perf_counter()
            found = await cache.lookup("ns", text)
            times.append((time.perf_counter() - t0) * 1e3)
            outcomes[found.outcome] = outcomes.get(found.outcome, 0) + 1
        return times, outcomes
    finally:
        await cache.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=60, help="rewordings asked, one each")
    ap.add_argument("--pause-ms", type=float, default=50.0, help="between two lookups")
    ap.add_argument("--ab", action="store_true", help="each also without context groups")
    args = ap.parse_args()
    for long in (False, True):
        for groups in (True, False) if args.ab else (True,):
            times, outcomes = asyncio.run(run(long, args.questions, args.pause_ms / 1e3, groups))
            p90 = sorted(times)[int(0.9 * (len(times) - 1))]
            print(
                f"{'long' if long else 'short'}{'' if groups else ' (no context groups)'}: "
                f"lookup p50 {statistics.median(times):.2f} ms, p90 {p90:.2f} ms, "
                f"outcomes {outcomes}",
                flush=True,
            )


if __name__ == "__main__":
    main()
