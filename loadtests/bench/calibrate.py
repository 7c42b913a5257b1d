"""Measure the generator itself against a trivial server, so its own ceiling is known.

The echo server runs in a child process (the other core on a 2-core machine) and answers in a few
microseconds; whatever limits throughput or makes sends late here is the generator.
"""

from __future__ import annotations

import atexit
import socket
import subprocess
import sys
import time

from .engine import closed_loop
from .measures import summary_row
from .modes import run_open
from .result import Bench, Result, Row
from .schedule import constant_times


def start_echo_server() -> str:
    """Start ``echo_server`` in a child process (stopped at exit); returns its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench.echo_server", str(port)], stdout=subprocess.DEVNULL
    )
    atexit.register(proc.terminate)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("echo server did not start")


async def calibrate(b: Bench, steps: list[int], rates: list[float], seconds: float) -> Result:
    """Closed-loop peak req/s per concurrency, then open-loop rates: achieved rate and lateness."""
    res = Result(
        "calibrate", {"steps": steps, "rates": rates, "seconds": seconds}, t0=time.perf_counter()
    )
    target = b.targets[0]
    closed: list[Row] = []
    for c in steps:
        samples: list = []
        async with b.progress.phase(f"closed c={c}", seconds):
            stats = await closed_loop(
                b.sender(target, "closed"), samples.append, c, seconds, b.max_requests
            )
        closed.append({"concurrency": c, **summary_row(samples, stats.wall_s)})
    opened: list[Row] = []
    for rate in rates:
        offsets = constant_times(rate, seconds, b.max_requests)
        _, row, _ = await run_open(b, offsets, f"open {rate:g}/s", 1_000_000)
        opened.append({"rate": rate, **row})
    res.tables["closed_loop"] = closed
    res.tables["open_loop"] = opened
    peak = max(closed, key=lambda r: float(r["req_per_s"]))
    res.notes.append(f"closed-loop peak: {peak['req_per_s']:.0f} req/s at c={peak['concurrency']}")
    kept = [
        r
        for r in opened
        if float(r["req_per_s"]) >= 0.95 * float(r["rate"]) and float(r["late_p99_ms"]) < 10
    ]
    best = max((float(r["rate"]) for r in kept), default=0.0)
    res.notes.append(
        f"open loop keeps up (>=95% of rate, send lateness p99 < 10 ms) up to "
        f"{best:g} req/s of the rates tried"
    )
    return res
