"""Exact-cache speed through the gateway, end to end on loopback.

Starts the zero-latency simulator and a `gateway serve` process in front of it (in-memory state,
or Redis with --redis), warms one entry, then times sequential identical requests (cache hits)
interleaved with requests sent straight to the simulator and with cache misses, so machine noise
hits all three alike. Bounded: --requests per kind.

    python -m loadtests.cache_speed --requests 2000 [--redis redis://127.0.0.1:6379/5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

from loadtests.bench.stats import summarize
from loadtests.processes import gateway_process
from loadtests.simulator.testing import spawn_fleet

WORDS = ["how do tides work", "why is the sky blue", "what is a prime number", "who wrote hamlet"]
POLICY = """
providers:
  zero: {{base_url: '{url}', max_inflight: 1024}}
pools:
  main: {{members: [zero]}}
classes:
  - {{name: interactive, max_prompt_tokens: 2000}}
models:
  chat: {{pool: main, routes: {{interactive: main}}{cache}}}
"""
SEMANTIC = ", cache: {exact: {enabled: false}, semantic: {enabled: true}}"


async def time_requests(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes]
) -> list[float]:
    out = []
    for body in bodies:
        t = time.perf_counter()
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
            await r.read()
            assert r.status == 200, r.status
        out.append(time.perf_counter() - t)
    return out


async def run(direct: str, gateway: str, n: int, rounds: int) -> dict[str, list[float]]:
    import orjson

    msg = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    hit = orjson.dumps({"model": "chat", "messages": msg, "temperature": 0, "max_tokens": 16})
    results: dict[str, list[float]] = {"direct": [], "gateway-hit": [], "gateway-miss": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        await time_requests(
            s, gateway + "/chat/completions", [hit] * 50
        )  # warm entry and connections
        await time_requests(s, direct + "/chat/completions", [hit] * 50)
        per = n // rounds
        for _ in range(rounds):
            nonce = uuid.uuid4().int % 10**9
            misses = [
                orjson.dumps(
                    {
                        "model": "chat",
                        "messages": [
                            {
                                "role": "user",
                                "content": f"Question number {nonce + i}: {WORDS[i % len(WORDS)]}?",
                            }
                        ],
                        "temperature": 0,
                        "max_tokens": 16,
                    }
                )
                for i in range(per)
            ]
            results["direct"] += await time_requests(s, direct + "/chat/completions", [hit] * per)
            results["gateway-hit"] += await time_requests(
                s, gateway + "/chat/completions", [hit] * per
            )
            results["gateway-miss"] += await time_requests(s, gateway + "/chat/completions", misses)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=2000, help="requests per kind")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--redis", default=None, help="REDIS_URL for the gateway (default: in-memory)")
    ap.add_argument(
        "--semantic",
        action="store_true",
        help="exact cache off, semantic cache on: hits are semantic (embedding + search + verifier)",
    )
    args = ap.parse_args()
    with spawn_fleet([{"name": "zero", "profile": "zero-latency"}]) as fleet:
        folder = Path(tempfile.mkdtemp(prefix="cache-speed-"))
        policy = folder / "policy.yaml"
        policy.write_text(
            POLICY.format(url=fleet.url("zero"), cache=SEMANTIC if args.semantic else "")
        )
        env = {"GATEWAY_ACCESS_LOG": "0"}
        if args.redis:
            env |= {"REDIS_URL": args.redis, "GATEWAY_REDIS_PREFIX": f"cachespeed:{os.getpid()}:"}
        with gateway_process(policy, env=env) as gw:
            res = asyncio.run(run(fleet.url("zero"), gw, args.requests, args.rounds))
    kind = ("semantic, " if args.semantic else "exact, ") + ("Redis" if args.redis else "in-memory")
    print(f"| path ({kind}) | n | p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, values in res.items():
        s = summarize(values)
        print(
            f"| {name} | {s.count} | {s.p50 * 1000:.3f} | {s.p90 * 1000:.3f} | {s.p99 * 1000:.3f} |"
        )


if __name__ == "__main__":
    main()
