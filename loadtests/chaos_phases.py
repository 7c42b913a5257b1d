"""The chaos benchmark's phases: what fails when, and what only the phases themselves can tell."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.chaos_procs import RedisServer, worker_pids
from loadtests.chaos_report import Run
from loadtests.simulator.testing import Fleet

PROVIDERS = ("p1", "p2", "p3", "spare")


class Chaos:
    def __init__(
        self,
        fleet: Fleet,
        redis: RedisServer,
        run: Run,
        phase_s: float,
        replicas: dict[str, str],
        route: dict[str, Any],
        policy: Path,
        r3: subprocess.Popen[bytes],
    ) -> None:
        self.fleet, self.redis, self.run, self.phase_s = fleet, redis, run, phase_s
        self.replicas, self.route, self.policy, self.r3 = replicas, route, policy, r3

    async def sleep(self, fraction: float) -> None:
        await asyncio.sleep(self.phase_s * fraction)

    def fault(self, name: str, **faults: Any) -> None:
        self.fleet.set_faults(name, **faults)
        self.run.mark(f"fault {name} {faults}")

    def clear(self, *names: str) -> None:
        for n in names:
            self.fleet.clear_faults(n)
        self.run.mark(f"recovered {','.join(names)}")

    async def phase(self, name: str) -> None:
        self.run.phase = name
        self.run.mark(f"phase: {name}")

    async def member_fault(self, name: str, member: str, **faults: Any) -> None:
        """One member misbehaves for 60% of the phase, then recovers (recovery measured)."""
        await self.phase(name)
        self.fault(member, **faults)
        await self.sleep(0.6)
        self.clear(member)
        await self.sleep(0.4)


async def wait_replayed(url: str, ids: list[str], within_s: float) -> dict[str, str]:
    """Fetch each deferred result until done (or the time is up): id -> final status."""
    status: dict[str, str] = {}
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            for rid in ids:
                if status.get(rid) in ("done", "failed"):
                    continue
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(f"{url}/v1/gateway/deferred/{rid}") as r:
                        status[rid] = (await r.json()).get("status", f"http {r.status}")
            if all(status.get(r) == "done" for r in ids):
                break
            await asyncio.sleep(0.5)
    return status


async def phases(chaos: Chaos) -> dict[str, Any]:
    """Walk the phases in order; returns what only the phases themselves can tell."""
    run, info = chaos.run, dict[str, Any]()
    replicas, route = chaos.replicas, chaos.route

    await chaos.phase("1 healthy")
    await chaos.sleep(1)
    await chaos.phase("2 p1 refuses connections")
    chaos.fault("p1", refuse_connections=True)
    await chaos.sleep(1)
    chaos.clear("p1")
    await chaos.phase("3 p2 first token 10x slower")
    chaos.fault("p2", ttft_multiplier=10)
    await chaos.sleep(1)
    chaos.clear("p2")
    await chaos.phase("4 p3 5% HTTP 500")
    chaos.fault("p3", error_rate=0.05, error_status=[500])
    await chaos.sleep(1)
    chaos.clear("p3")
    await chaos.phase("5 all providers down")
    for name in PROVIDERS:
        chaos.fault(name, refuse_connections=True)
    await chaos.sleep(1)
    await chaos.phase("6 recovery")
    chaos.clear(*PROVIDERS)
    await chaos.sleep(1)
    ids = [o.deferred for o in run.outcomes if o.deferred]
    run.mark(f"checking {len(ids)} deferred results")
    info["replay"] = await wait_replayed(replicas["r1"], ids, within_s=60)
    run.mark("deferred results fetched")
    await chaos.phase("7 Redis killed and restarted")
    await chaos.sleep(0.3)
    chaos.redis.kill()
    run.mark("redis killed")
    await chaos.sleep(0.35)
    chaos.redis.start()
    run.mark("redis restarted")
    await chaos.sleep(0.35)
    await chaos.phase("8 two replicas, p1 fails")
    route["share"] = 10  # a steady stream to replica 2 as well (10%)
    await chaos.sleep(0.1)
    chaos.fault("p1", error_rate=1.0, error_status=[500])
    await chaos.sleep(0.5)
    chaos.clear("p1")
    await chaos.sleep(0.4)
    route["share"] = 0
    # Broken and slow members: every answer's text is checked, so a broken 200 cannot pass.
    await chaos.member_fault("9 p1 answers 200 with garbage JSON", "p1", broken_body="garbage_json")
    await chaos.member_fault("10 p2 answers 200 with an HTML page", "p2", broken_body="html")
    await chaos.member_fault(
        "11 p3 answers 200 with truncated JSON", "p3", broken_body="truncated_json"
    )
    await chaos.member_fault("12 p1 streams end without [DONE]", "p1", end_stream_after_chunks=3)
    await chaos.member_fault("13 p2 hangs before the headers", "p2", hang=True)
    await chaos.member_fault("14 p3 trickles its answers", "p3", trickle_bytes_per_s=40)
    await chaos.member_fault(
        "15 p1 latency spikes (5% take 10 s)", "p1", spike_rate=0.05, spike_ms=10_000
    )
    await reloads(chaos)
    info["redis_restart"] = await redis_restart_empty(chaos)
    info["worker_kill"] = await worker_kill(chaos)
    return info


async def reloads(chaos: Chaos) -> None:
    """Two reloads 1 s apart (total_s is 20 s), each replacing every provider's pool."""
    await chaos.phase("16 two reloads in quick succession")
    await chaos.sleep(0.2)
    original = chaos.policy.read_text()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for n in (1, 2):
            changed = original.replace(
                "    simulated: true",
                f"    simulated: true\n    headers: {{x-chaos-reload: '{n}'}}",
            )
            chaos.policy.write_text(changed)
            for name in ("r1", "r2", "r3"):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.post(chaos.replicas[name] + "/admin/reload") as r:
                        reply = await r.json()
            chaos.run.mark(f"reload {n}: {reply}")
            await asyncio.sleep(1.0)
    await chaos.sleep(0.6)


async def redis_restart_empty(chaos: Chaos) -> dict[str, Any]:
    """Every provider down, requests queued; Redis restarted without persistence (empty) while
    they wait; more queued after it returned; then the providers recover."""
    run = chaos.run
    await chaos.phase("17 Redis restarted empty with requests queued")
    for name in PROVIDERS:
        chaos.fault(name, refuse_connections=True)
    await chaos.sleep(0.3)
    chaos.redis.kill()
    chaos.redis.start()
    restarted = run.mark("redis restarted empty")
    await chaos.sleep(0.3)
    chaos.clear(*PROVIDERS)
    await chaos.sleep(0.4)
    queued = [o for o in run.outcomes if o.phase.startswith("17") and o.deferred]
    before = [o.deferred for o in queued if o.end_s < restarted and o.deferred]
    after = [o.deferred for o in queued if o.end_s >= restarted and o.deferred]
    run.mark(f"checking {len(before)} + {len(after)} deferred results")
    status = await wait_replayed(chaos.replicas["r1"], before + after, within_s=45)

    def tally(ids: list[str]) -> dict[str, int]:
        done = sum(status.get(i) == "done" for i in ids)
        gone = sum(status.get(i) == "http 404" for i in ids)
        return {"total": len(ids), "done": done, "gone_with_redis_data": gone}

    return {"before": tally(before), "after": tally(after)}


async def worker_kill(chaos: Chaos) -> dict[str, Any]:
    """Traffic to r3 (`--workers 2`); one worker killed with SIGKILL; the parent replaces it."""
    run = chaos.run
    chaos.route["first"] = chaos.replicas["r3"]
    await chaos.phase("18 worker killed (SIGKILL)")
    await chaos.sleep(0.3)
    before = worker_pids(chaos.r3.pid)
    if not before:
        return {"error": "no worker processes found"}
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    killed = run.mark(f"worker {victim} of r3 killed")
    replaced = None
    while run.now() - killed < chaos.phase_s * 0.7:
        now = worker_pids(chaos.r3.pid)
        if replaced is None and victim not in now and len(now) >= len(before):
            replaced = run.mark(f"r3 has {len(now)} workers again")
        await asyncio.sleep(0.01)
    got = [o for o in run.outcomes if o.phase.startswith("18")]
    bad = [o for o in got if o.kind in ("failed", "lost", "broken")]
    chaos.route["first"] = chaos.replicas["r1"]
    return {
        "replaced_after_s": None if replaced is None else round(replaced - killed, 3),
        "failed_or_lost": len(bad),
        "degraded_window_s": round(max(o.end_s for o in bad) - min(o.end_s for o in bad), 3)
        if bad
        else 0.0,
        "requests": len(got),
    }
