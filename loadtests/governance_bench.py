"""Cost of limits on the request path, side by side in one interleaved run (one bounded command).

    python -m loadtests.governance_bench [--requests 1500] [--redis-url redis://127.0.0.1:6379/0]

Starts two zero-latency simulator instances and four `gateway serve` processes (one worker each,
all sharing one Redis under unique key prefixes) with loadtests/overhead.yaml plus:

- `off`, `off-b`: no limits (the baseline, twice: their difference is the noise floor);
- `far`:  requests/min, tokens/min and concurrency limits on the caller's tenant, far from the
          limits: leases from Redis cover many requests;
- `near`: the same limits with a lease fraction of 1e-9, so every request takes its lease from
          Redis (one Lua round trip for the buckets, one for a concurrency slot, and the slot's
          return in the background) — what each request pays when a scope is close to its limit.

One client sends sequential requests, alternating target on every request (off, off-b, far, near,
off, ...), so all four see the same machine state. Prints p50/p90/mean per target, the p50 added over
`off`, and the Redis lease round trips per request (from /metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

from loadtests.overhead import POLICY, ROOT, _clear_redis, free_port, process
from loadtests.scrape import metric_sum, metrics_of
from loadtests.simulator.testing import spawn_fleet

LIMITS = (
    "{requests_per_minute: 100000000, tokens_per_minute: 1000000000000, max_concurrent: 100000}"
)
VARIANTS = {
    "off": "",
    "off-b": "",  # a second, identical baseline: the spread between the two is the noise floor
    "far": f"governance:\n  default_tenant: {{limits: {LIMITS}}}\n",
    "near": (
        "governance:\n  sync: {lease_fraction: 0.000000001}\n"
        f"  default_tenant: {{limits: {LIMITS}}}\n"
    ),
}


def _leases(url: str) -> float:
    return metric_sum(metrics_of(url), "gateway_ratelimit_redis_leases_total")


async def _measure(urls: dict[str, str], n: int) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {k: [] for k in urls}
    sessions = {k: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for k in urls}
    try:
        for i in range(n + 50):
            for name, url in urls.items():
                body = {
                    "model": "default",
                    "messages": [{"role": "user", "content": uuid.uuid4().hex}],
                }
                start = time.perf_counter()
                async with sessions[name].post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise SystemExit(f"{name}: HTTP {r.status}")
                if i >= 50:  # warm-up
                    lat[name].append(time.perf_counter() - start)
    finally:
        for s in sessions.values():
            await s.close()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500, help="Measured requests per target.")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    a = ap.parse_args()
    fleet = spawn_fleet(
        [
            {"name": "zero-a", "profile": "zero-latency"},
            {"name": "zero-b", "profile": "zero-latency"},
        ]
    )
    prefixes: list[str] = []
    with fleet, tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for name, extra in VARIANTS.items():
            policy = Path(tmp) / f"{name}.yaml"
            policy.write_text(POLICY.read_text() + "\n" + extra)
            port = free_port()
            prefix = f"govbench-{uuid.uuid4().hex[:8]}:"
            prefixes.append(prefix)
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "OVERHEAD_URL_A": fleet.url("zero-a"),
                "OVERHEAD_URL_B": fleet.url("zero-b"),
                "REDIS_URL": a.redis_url,
                "GATEWAY_REDIS_PREFIX": prefix,
                "GATEWAY_ACCESS_LOG": "0",
            }
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            cmd += ["--policy", str(policy), "--log-level", "warning"]
            stack.enter_context(process(cmd, env, f"http://127.0.0.1:{port}/health"))
            urls[name] = f"http://127.0.0.1:{port}"
        leases0 = {k: _leases(u) for k, u in urls.items()}
        lat = asyncio.run(_measure(urls, a.requests))
        leases = {k: _leases(u) - leases0[k] for k, u in urls.items()}
    for p in prefixes:
        _clear_redis(a.redis_url, p)
    base = (statistics.median(lat["off"]) + statistics.median(lat["off-b"])) / 2
    print(f"{a.requests} sequential requests per target, interleaved request by request")
    print(
        "| target | p50 ms | p90 ms | mean ms | p50 added vs off (mean of both) | Redis leases per request |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, xs in lat.items():
        xs.sort()
        p50, p90 = statistics.median(xs), xs[int(len(xs) * 0.9)]
        added = (p50 - base) * 1000
        per = leases[name] / (a.requests + 50)
        print(
            f"| {name} | {p50 * 1000:.3f} | {p90 * 1000:.3f} | {statistics.fmean(xs) * 1000:.3f}"
            f" | {added:+.3f} ms | {per:.3f} |"
        )

    print()
    print(asyncio.run(_in_process(a.redis_url, a.requests * 5)))


async def _in_process(redis_url: str, n: int) -> str:
    """The governance step alone (admit + record), µs per request, same Redis, same interleaving."""
    from gateway.context import Context
    from gateway.infra.shared_state import SharedState
    from gateway.pipeline.stack import Pipeline
    from gateway.policy.loader import parse_policy
    from gateway.routing.decision import decide
    from gateway.runtime import Runtime
    from gateway.wire.request import parse_request

    env = {"OVERHEAD_URL_A": "http://127.0.0.1:9/v1", "OVERHEAD_URL_B": "http://127.0.0.1:9/v1"}
    raw = b'{"model": "default", "messages": [{"role": "user", "content": "hi"}]}'
    sides = {}
    states = []
    for name in ("off", "far", "near"):
        policy = parse_policy(POLICY.read_text() + "\n" + VARIANTS[name], env=env)
        state = SharedState(redis_url, prefix=f"govbench-{uuid.uuid4().hex[:8]}:")
        states.append(state)
        runtime = Runtime(policy)
        gov = Pipeline(runtime, state).governance
        await gov.start(policy.governance)
        sides[name] = (runtime, gov)
    acc = parse_request(raw, "chat")
    times: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(n):
        for name, (runtime, gov) in sides.items():
            snap = runtime.snapshot
            decision = decide(snap.policy, acc, "default", None)
            ctx = Context("bench", time.perf_counter())
            start = time.perf_counter()
            principal = await gov.authenticate(snap, None)
            await gov.admit(snap, principal, acc, decision, ctx)
            ctx.status, ctx.provider, ctx.alias = 200, "zero-a", "default"
            ctx.response_body = b'{"usage": {"prompt_tokens": 9, "completion_tokens": 5}}'
            gov.record(ctx)
            if i >= 100:
                times[name].append(time.perf_counter() - start)
    for (_, gov), state in zip(sides.values(), states, strict=True):
        await gov.stop()
        _clear_redis(redis_url, state.prefix)
        await state.aclose()
    lines = [f"In process, the governance step alone ({n - 100} requests each, interleaved):"]
    lines.append("| target | p50 µs | p90 µs |")
    lines.append("| --- | --- | --- |")
    for name, xs in times.items():
        xs.sort()
        lines.append(
            f"| {name} | {statistics.median(xs) * 1e6:.1f} | {xs[int(len(xs) * 0.9)] * 1e6:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
