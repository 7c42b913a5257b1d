"""Chaos benchmark: steady open-loop load through a real gateway while providers and Redis fail.

    python -m loadtests.chaos [--rate 50] [--phase-s 8] [--out chaos.json]

Starts a simulated fleet (three providers in pool `main`, one in pool `reserve`), its own
redis-server on a free port, and the gateway as real processes (`gateway serve`, policy
`loadtests/chaos-policy.yaml`, rules `loadtests/chaos-rules/`): replicas r1 and r2 (one worker
each) and r3 (two workers, for the killed-worker phase). Then it sends a constant ~50 req/s (half
streamed, a fifth cacheable) and walks the phases below, each `--phase-s` long: provider outages,
slow and broken members (200s with garbage JSON, HTML or truncated JSON, streams ending without
[DONE], a hang before the headers, a slow trickle, latency spikes), Redis killed, Redis restarted
empty with requests queued, two reloads in quick succession and a worker killed with SIGKILL.
A monitor polls `GET /admin/breakers` of r1 and r2 every 20 ms to time breaker transitions.
Everything runs on 127.0.0.1 and stops by itself (about 3-4 minutes).

Every answer is checked word for word against the text the simulator generates for the request
(`loadtests/chaos_answers.py`), not only its status. Per phase: requests sent, succeeded (the
exact text, undegraded), degraded (a rule's marked answer), shed (429), failed (an error status
or a stream that ended with an error event: honest failures), broken (a 200 whose content is not
the upstream's answer: a broken answer passed as a success), lost (sent, no response); p50/p99
latency from the scheduled send time. Then breaker open/close times, how soon a recovered member
is back in rotation, cross-replica propagation, replays, and the targets (`chaos_report.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.chaos_answers import classify, expected_text
from loadtests.chaos_report import (
    Outcome,
    Run,
    breaker_times,
    markdown,
    phase_table,
    propagation,
    recovery_times,
    targets,
)
from loadtests.simulator.testing import Fleet, spawn_fleet

HERE = Path(__file__).resolve().parent
PROVIDERS = ("p1", "p2", "p3", "spare")
FLEET = [{"name": n, "profile": "low-latency"} for n in PROVIDERS]


# -- processes --------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """Our own throwaway redis-server (never a shared one): killed and restarted on purpose."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        self.proc = subprocess.Popen(
            [*args, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def start_gateway(
    env: dict[str, str], log_path: Path, workers: int = 1
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_port(port)
    return proc, f"http://127.0.0.1:{port}"


def worker_pids(parent: int) -> set[int]:
    """The live uvicorn worker processes of a `gateway serve --workers N` parent (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z" and b"spawn_main" in cmd:
            found.add(int(entry.name))
    return found


# -- load -------------------------------------------------------------------------------------------


def request_body(i: int) -> tuple[dict[str, Any], bool]:
    stream = i % 2 == 0
    cached = i % 5 == 0  # a few repeated, cacheable prompts: the exact cache uses Redis
    text = f"question {i % 20}" if cached else f"{uuid.uuid4().hex} tell me something"
    body: dict[str, Any] = {
        "model": "chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 16,
        "stream": stream,
    }
    if cached:
        body["temperature"] = 0
    return body, stream


async def one_request(
    session: aiohttp.ClientSession, url: str, run: Run, i: int, scheduled: float
) -> None:
    phase = run.phase
    run.sent[phase] = run.sent.get(phase, 0) + 1
    body, stream = request_body(i)
    expected = expected_text(body)
    kind, deferred, detail, provider, hedged = "lost", None, "", "", False
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            raw = await resp.read()
            degraded = resp.headers.get("x-gateway-degraded") == "true"
            deferred = resp.headers.get("x-gateway-deferred")
            provider = resp.headers.get("x-gateway-provider", "")
            hedged = resp.headers.get("x-gateway-hedged") == "true"
            kind = classify(resp.status, degraded, raw, stream, expected)
            if kind != "succeeded":
                rule = resp.headers.get("x-gateway-rule", "")
                detail = f"{resp.status} {rule} {provider} {raw[-300:]!r}"
    except (aiohttp.ClientError, TimeoutError) as e:
        kind, detail = "lost", repr(e)
    latency = time.monotonic() - scheduled
    run.outcomes.append(
        Outcome(
            phase, kind, latency, stream, deferred, detail, run.phase, provider, run.now(), hedged
        )
    )


async def load(route: dict[str, Any], run: Run, rate: float, stop: asyncio.Event) -> None:
    """Constant-rate open loop; `route` says where request i goes (changed by the phases):
    `share` percent of them to `second`, the rest to `first`."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        tasks: set[asyncio.Task[None]] = set()
        start, i = time.monotonic(), 0
        while not stop.is_set():
            scheduled = start + i / rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            target = route["second"] if (i % 100) < route["share"] else route["first"]
            task = asyncio.create_task(one_request(session, target, run, i, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        await asyncio.gather(*tasks, return_exceptions=True)


async def monitor(replicas: dict[str, str], run: Run, stop: asyncio.Event) -> None:
    """Poll every replica's breakers; record each state change with its time."""
    seen: dict[tuple[str, str], str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while not stop.is_set():
            for name, url in list(replicas.items()):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(url + "/admin/breakers") as r:
                        snap = await r.json()
                    for provider, b in snap.items():
                        if seen.get((name, provider)) != b["state"]:
                            seen[(name, provider)] = b["state"]
                            run.transitions.append((run.now(), name, provider, b["state"]))
            await asyncio.sleep(0.02)


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


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    run = Run()
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    redis = RedisServer()
    redis.start()
    fleet = spawn_fleet(FLEET)
    procs: list[subprocess.Popen[bytes]] = []
    policy = tmp / "chaos-policy.yaml"  # a copy: the reload phase rewrites it
    policy.write_text((HERE / "chaos-policy.yaml").read_text())
    try:
        env = {
            **{f"CHAOS_{n.upper()}": fleet.url(n) for n in PROVIDERS},
            "CHAOS_RULES": str(HERE / "chaos-rules"),
            "GATEWAY_POLICY": str(policy),
            "REDIS_URL": redis.url,
            "GATEWAY_REDIS_PREFIX": f"chaos:{uuid.uuid4().hex[:6]}:",
        }
        replicas: dict[str, str] = {}
        for name, workers in (("r1", 1), ("r2", 1), ("r3", 2)):
            proc, url = start_gateway(env, tmp / f"{name}.log", workers)
            procs.append(proc)
            replicas[name] = url
        run.mark(f"gateways {replicas}, redis {redis.url}, logs in {tmp}")
        stop = asyncio.Event()
        route: dict[str, Any] = {"first": replicas["r1"], "second": replicas["r2"], "share": 0}
        monitored = {k: v for k, v in replicas.items() if k != "r3"}
        background = [
            asyncio.create_task(load(route, run, args.rate, stop)),
            asyncio.create_task(monitor(monitored, run, stop)),
        ]
        chaos = Chaos(fleet, redis, run, args.phase_s, replicas, route, policy, procs[2])
        info = await phases(chaos)
        stop.set()
        await asyncio.gather(*background)
    finally:
        for proc in procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        fleet.close()
        redis.kill()
    logs = "".join((tmp / f"{n}.log").read_text(errors="replace") for n in ("r1", "r2", "r3"))
    info["breakers"] = breaker_times(run)
    info["recovery"] = recovery_times(run)
    info["propagation"] = propagation(run)
    info["max_cooldown_s"] = 4.0
    info["redis_log_lines"] = [ln for ln in logs.splitlines() if "redis" in ln.lower()][-50:]
    rows = phase_table(run)
    return {
        "rate": args.rate,
        "phase_s": args.phase_s,
        "phases": rows,
        **info,
        "replay": {"count": len(info["replay"]), "statuses": sorted(set(info["replay"].values()))},
        "targets": [
            {"target": t, "met": m, "measured": v} for t, m, v in targets(rows, info, run.outcomes)
        ],
        "problems": [
            {"phase": o.phase, "kind": o.kind, "detail": o.detail}
            for o in run.outcomes
            if o.kind in ("failed", "lost", "broken")
            or (o.kind == "degraded" and o.phase.split()[0] not in ("5", "6", "17"))
        ],
        "marks": run.marks,
        "transitions": run.transitions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--phase-s", type=float, default=8.0, help="seconds per phase")
    parser.add_argument("--out", type=Path, default=Path("chaos.json"), help="JSON result file")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print()
    print(markdown(result["phases"]))
    print()
    for b in result["breakers"]:
        print(
            f"- {b['fault']}: open after {b['open_after_s']} s, "
            f"closed {b['closed_after_recovery_s']} s after recovery"
        )
    for r in result["recovery"]:
        print(
            f"- {r['member']} recovered at {r['fault_ended_at_s']} s: first answer after "
            f"{r['first_answer_after_s']} s, back in rotation after {r['back_in_rotation_after_s']} s"
        )
    print(f"- propagation (phase 8): {result['propagation']}")
    print(f"- Redis restarted empty: {result.get('redis_restart')}")
    print(f"- worker killed: {result.get('worker_kill')}")
    print(f"- replayed: {result['replay']}")
    print(f"- Redis log lines: {len(result['redis_log_lines'])}")
    print()
    for t in result["targets"]:
        print(f"- [{'x' if t['met'] else ' '}] {t['target']}: {t['measured']}")
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
