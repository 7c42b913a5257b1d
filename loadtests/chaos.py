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
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.chaos_answers import classify, expected_text
from loadtests.chaos_phases import PROVIDERS, Chaos, phases
from loadtests.chaos_procs import RedisServer, start_gateway
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
from loadtests.simulator.testing import spawn_fleet

HERE = Path(__file__).resolve().parent
FLEET = [{"name": n, "profile": "low-latency"} for n in PROVIDERS]


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
        # Every answer (phase, kind, latency, stream, provider, completion time): enough to
        # recompute the table and the targets.
        "outcomes": [
            [
                o.phase,
                o.ended,
                o.kind,
                round(o.latency_s, 4),
                o.stream,
                o.provider,
                round(o.end_s, 3),
            ]
            for o in run.outcomes
        ],
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
