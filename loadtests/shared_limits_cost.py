"""What sharing the limits among processes costs a request: latency at one client, side by side.

Two `gateway serve --workers 2` over the same zero-latency simulators and the same Redis, one with
`replicas.share_limits: true` (each worker announces itself every heartbeat and takes half of
every max_inflight), one with it off; one client sends requests one at a time, alternating rounds
between the two, and the p50/p99 of each are compared (the median of the per-round p50s).

    python -m loadtests.shared_limits_cost --redis-url redis://127.0.0.1:6379/0 --rounds 6 --requests 400
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from loadtests.overhead import POLICY, _clear_redis, free_port, process
from loadtests.simulator.testing import spawn_fleet


@contextlib.contextmanager
def gateway(fleet_urls: dict[str, str], share: bool, redis_url: str, folder: Path) -> Iterator[int]:
    policy = folder / f"policy-{'shared' if share else 'local'}.yaml"
    text = POLICY.read_text().replace("max_inflight: 100000", "max_inflight: 1000")
    policy.write_text(text + f"replicas: {{share_limits: {str(share).lower()}}}\n")
    port = free_port()
    prefix = f"limits-cost-{uuid.uuid4().hex[:8]}:"
    env = {
        **os.environ,
        "OVERHEAD_URL_A": fleet_urls["zero-a"],
        "OVERHEAD_URL_B": fleet_urls["zero-b"],
        "REDIS_URL": redis_url,
        "GATEWAY_REDIS_PREFIX": prefix,
    }
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    cmd += ["--policy", str(policy), "--workers", "2", "--log-level", "warning"]
    try:
        with process(cmd, env, f"http://127.0.0.1:{port}/health"):
            yield port
    finally:
        _clear_redis(redis_url, prefix)


def latencies(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    try:
        for _ in range(n):
            body = json.dumps(
                {"model": "default", "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
            )
            t0 = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            out.append(time.perf_counter() - t0)
            if r.status != 200:
                raise SystemExit(f"HTTP {r.status}")
    finally:
        conn.close()
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=400)
    a = ap.parse_args()
    specs = [{"name": n, "profile": "zero-latency"} for n in ("zero-a", "zero-b")]
    with tempfile.TemporaryDirectory() as tmp, spawn_fleet(specs) as fleet:
        urls = fleet.urls()
        with (
            gateway(urls, True, a.redis_url, Path(tmp)) as shared,
            gateway(urls, False, a.redis_url, Path(tmp)) as local,
        ):
            for port in (shared, local):
                latencies(port, 100)  # warm both workers' pools
            results: dict[str, list[list[float]]] = {"shared": [], "local": []}
            for _ in range(a.rounds):
                for name, port in (("shared", shared), ("local", local)):
                    results[name].append(latencies(port, a.requests))
    rows = {}
    for name, rounds in results.items():
        p50 = statistics.median(pct(r, 0.5) for r in rounds) * 1000
        p99 = statistics.median(pct(r, 0.99) for r in rounds) * 1000
        rows[name] = (p50, p99)
        print(f"{name:>7}: p50 {p50:.3f} ms  p99 {p99:.3f} ms  ({a.rounds} rounds x {a.requests})")
    print(
        f"added by sharing: p50 {rows['shared'][0] - rows['local'][0]:+.3f} ms, "
        f"p99 {rows['shared'][1] - rows['local'][1]:+.3f} ms"
    )


if __name__ == "__main__":
    main()
