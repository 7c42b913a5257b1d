"""Gateway CPU per request at two commits, side by side: medians of per-round ratios.

    python -m loadtests.cpu_ab --baseline REV [--new REV_OR_PATH] [--rounds 6] [--seconds 6]
                               [--concurrency 16] [--stream] [--alternate] [--out result.json]

One `gateway serve` (1 worker, loadtests/overhead.yaml of each tree) per side in front of the same
two zero-latency simulator instances; closed-loop clients send the load generator's request shape
(a ~100-token unique prompt, a fresh one for every request, so each misses the exact cache;
max_tokens 64, temperature 0, streams asking for usage). By default each round loads both sides
at once, half of `--concurrency` clients each, so the machine's bursts of noise land on both;
`--alternate` loads one side then the other, alternating which goes first. The figure is the
gateway process's CPU time (/proc) per completed request, and the result the median over the
rounds of each round's new/baseline ratio, which keeps a busy machine's drift out of it.
Throughput is reported too but is not the figure: the clients share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from loadtests.bench.procstat import read_proc
from loadtests.bench.prompts import chat_body, make_prompt
from loadtests.overhead import BENCH_KEY, POLICY, ROOT, baseline_tree, free_port, wait_http
from loadtests.simulator.testing import Fleet, spawn_fleet


@contextlib.contextmanager
def serve(root: Path, fleet: Fleet) -> Iterator[tuple[int, str]]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "OVERHEAD_URL_A": fleet.url("zero-a"),
        "OVERHEAD_URL_B": fleet.url("zero-b"),
    }
    env.pop("REDIS_URL", None)
    policy = root / POLICY.relative_to(ROOT)
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    cmd += ["--policy", str(policy), "--workers", "1", "--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield proc.pid, f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


_SEEDS = itertools.count(1)


async def closed_loop(url: str, seconds: float, concurrency: int, stream: bool) -> int:
    """Requests completed by `concurrency` clients in `seconds` (each must be a 200).

    Every loop draws from its own seed: prompts never repeat across loops, so every request
    misses the exact cache (a repeated seed made later rounds mostly cache hits).
    """
    rng = random.Random(next(_SEEDS))
    done = 0
    stop = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {BENCH_KEY}", "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            nonlocal done
            while time.monotonic() < stop:
                body = chat_body("default", make_prompt(100, rng), 64, stream)
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"gateway answered {r.status}")
                done += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return done


def measure(pid: int, url: str, a: argparse.Namespace) -> tuple[float, float]:
    """(CPU ms per request, requests per second) of one round."""
    before, t0 = read_proc(pid).cpu_s, time.monotonic()
    n = asyncio.run(closed_loop(url, a.seconds, a.concurrency, a.stream))
    after, t1 = read_proc(pid).cpu_s, time.monotonic()
    return (after - before) / n * 1000, n / (t1 - t0)


def measure_together(
    sides: dict[str, tuple[int, str]], a: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """Both sides loaded at once, half the clients each: a burst of the machine's noise lands
    on both (the default; back-to-back windows on this kind of machine differ by up to 2x)."""
    names = list(sides)
    half = max(1, a.concurrency // 2)

    async def both() -> list[int]:
        loops = (closed_loop(sides[k][1], a.seconds, half, a.stream) for k in names)
        return list(await asyncio.gather(*loops))

    before = {k: read_proc(sides[k][0]).cpu_s for k in names}
    t0 = time.monotonic()
    done = asyncio.run(both())
    elapsed = time.monotonic() - t0
    after = {k: read_proc(sides[k][0]).cpu_s for k in names}
    return {
        k: ((after[k] - before[k]) / n * 1000, n / elapsed)
        for k, n in zip(names, done, strict=True)
    }


@contextlib.contextmanager
def tree(rev_or_path: str) -> Iterator[Path]:
    path = Path(rev_or_path)
    if path.is_dir():
        yield path.resolve()
    else:
        with baseline_tree(rev_or_path) as t:
            yield t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--baseline", required=True, help="the old side: a commit (or a folder)")
    p.add_argument("--new", default=str(ROOT), help="the new side: a folder (default: this tree)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--stream", action="store_true")
    p.add_argument(
        "--alternate",
        action="store_true",
        help="load one side, then the other (the first design) instead of both at once",
    )
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    fleet = spawn_fleet(
        [
            {"name": "zero-a", "profile": "zero-latency"},
            {"name": "zero-b", "profile": "zero-latency"},
        ]
    )
    rounds: dict[str, list[tuple[float, float]]] = {"baseline": [], "new": []}
    try:
        with (
            tree(a.baseline) as old_root,
            tree(a.new) as new_root,
            serve(old_root, fleet) as old,
            serve(new_root, fleet) as new,
        ):
            sides = {"baseline": old, "new": new}
            for _pid, url in sides.values():  # warm: imports, pools, tokenizer caches
                asyncio.run(closed_loop(url, 2.0, a.concurrency, a.stream))
            for r in range(a.rounds):
                if not a.alternate:
                    for name, got in measure_together(sides, a).items():
                        rounds[name].append(got)
                        print(
                            f"round {r} {name:8s} {got[0]:.4f} ms CPU/request  {got[1]:,.0f} req/s"
                        )
                    continue
                order = ("baseline", "new") if r % 2 == 0 else ("new", "baseline")
                for name in order:
                    rounds[name].append(measure(*sides[name], a))
                    cpu, rps = rounds[name][-1]
                    print(f"round {r} {name:8s} {cpu:.4f} ms CPU/request  {rps:,.0f} req/s")
    finally:
        fleet.close()
    med = {k: statistics.median(c for c, _ in v) for k, v in rounds.items()}
    rps = {k: statistics.median(r for _, r in v) for k, v in rounds.items()}
    # Each round's two sides ran at once (or back to back), under the same conditions: their
    # ratio is the figure, its median over the rounds the result (drift between rounds cancels).
    pairs = sorted(n[0] / b[0] for n, b in zip(rounds["new"], rounds["baseline"], strict=True))
    ratio = statistics.median(pairs)
    kind = "stream" if a.stream else "unary"
    print(
        f"{kind}: CPU ms/request median baseline {med['baseline']:.4f}, new {med['new']:.4f}; "
        f"new/baseline per round {', '.join(f'{x:.3f}' for x in pairs)}: median {ratio:.3f} "
        f"({(ratio - 1) * 100:+.1f}%); req/s {rps['baseline']:,.0f} vs {rps['new']:,.0f}"
    )
    if a.out is not None:
        a.out.write_text(
            json.dumps(
                {
                    "mode": kind,
                    "baseline": a.baseline,
                    "rounds": rounds,
                    "ratios": pairs,
                    "ratio": ratio,
                }
            )
        )


if __name__ == "__main__":
    main()
