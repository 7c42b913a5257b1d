"""Chaos benchmark: steady open-loop load through a real gateway while providers and Redis fail.

    python -m loadtests.chaos [--rate 50] [--phase-s 15] [--out chaos.json]

Starts a simulated fleet (three providers in pool `main`, one in pool `reserve`), its own
redis-server on a free port, and the gateway as a real process (`gateway serve`, policy
`loadtests/chaos-policy.yaml`, rules `loadtests/chaos-rules/`). Then it sends a constant ~50 req/s
(half streamed) and walks the phases below, each `--phase-s` long. A monitor polls
`GET /admin/breakers` of every replica every 20 ms to time breaker transitions. Everything runs on
127.0.0.1 and stops by itself (about 2-4 minutes).

Per phase: requests sent, succeeded (a complete, undegraded answer), degraded (a rule's marked
answer), shed (429), failed (any other error, or a stream that ended in an error event), lost
(sent, no response); p50/p99 latency from the scheduled send time. Then breaker open/close times,
cross-replica propagation and whether every queued request was replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.bench.stats import percentiles
from loadtests.simulator.testing import Fleet, spawn_fleet

HERE = Path(__file__).resolve().parent
PROVIDERS = ("p1", "p2", "p3", "spare")
FLEET = [{"name": n, "profile": "low-latency"} for n in PROVIDERS]


@dataclass
class Outcome:
    phase: str
    kind: str  # succeeded | degraded | shed | failed | lost
    latency_s: float
    deferred: str | None = None
    detail: str = ""  # status and body start of anything but a success
    ended: str = ""  # the phase when the answer was complete


@dataclass
class Run:
    """Everything measured, in one place."""

    t0: float = field(default_factory=time.monotonic)
    phase: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)  # (t, what happened)
    transitions: list[tuple[float, str, str, str]] = field(
        default_factory=list
    )  # t, replica, p, state

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, what: str) -> float:
        t = self.now()
        self.marks.append((t, what))
        print(f"  {t:7.2f}s  {what}", flush=True)
        return t


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


def start_gateway(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
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
            "--log-level",
            "warning",
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_port(port)
    return proc, f"http://127.0.0.1:{port}"


# -- load -------------------------------------------------------------------------------------------


async def one_request(
    session: aiohttp.ClientSession, url: str, run: Run, i: int, scheduled: float
) -> None:
    phase = run.phase
    run.sent[phase] = run.sent.get(phase, 0) + 1
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
    kind, deferred, detail = "failed", None, ""
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            raw = await resp.read()
            degraded = resp.headers.get("x-gateway-degraded") == "true"
            deferred = resp.headers.get("x-gateway-deferred")
            if resp.status == 429:
                kind = "shed"
            elif resp.status == 200 and degraded:
                kind = "degraded"
            elif resp.status == 200 and _complete(raw, stream):
                kind = "succeeded"
            if kind != "succeeded":
                rule = resp.headers.get("x-gateway-rule", "")
                detail = f"{resp.status} {rule} {resp.headers.get('x-gateway-pool')} {raw[-300:]!r}"
    except (aiohttp.ClientError, TimeoutError) as e:
        kind, detail = "lost", repr(e)
    latency = time.monotonic() - scheduled
    run.outcomes.append(Outcome(phase, kind, latency, deferred, detail, run.phase))


def _complete(raw: bytes, stream: bool) -> bool:
    if not stream:
        return b'"choices"' in raw
    return raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw


async def load(
    urls: list[str], weights: list[float], run: Run, rate: float, stop: asyncio.Event
) -> None:
    """Constant-rate open loop; request i goes to a replica by the current weights."""
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
            target = urls[0] if (i % 100) < weights[0] * 100 else urls[-1]
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


# -- phases -----------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, fleet: Fleet, redis: RedisServer, run: Run, phase_s: float) -> None:
        self.fleet, self.redis, self.run, self.phase_s = fleet, redis, run, phase_s

    async def sleep(self, fraction: float) -> None:
        await asyncio.sleep(self.phase_s * fraction)

    def fault(self, name: str, **faults: Any) -> None:
        self.fleet.set_faults(name, **faults)
        self.run.mark(f"fault {name} {faults}")

    def clear(self, *names: str) -> None:
        for n in names:
            self.fleet.clear_faults(n)
        self.run.mark(f"recovered {','.join(names)}")


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


async def phases(chaos: Chaos, replicas: dict[str, str], weights: list[float]) -> dict[str, Any]:
    """Walk the phases in order; returns what only the phases themselves can tell."""
    run, fleet, info = chaos.run, chaos.fleet, dict[str, Any]()

    async def phase(name: str) -> None:
        run.phase = name
        run.mark(f"phase: {name}")

    await phase("1 healthy")
    await chaos.sleep(1)
    await phase("2 p1 refuses connections")
    chaos.fault("p1", refuse_connections=True)
    await chaos.sleep(1)
    chaos.clear("p1")
    await phase("3 p2 first token 10x slower")
    chaos.fault("p2", ttft_multiplier=10)
    await chaos.sleep(1)
    chaos.clear("p2")
    await phase("4 p3 5% HTTP 500")
    chaos.fault("p3", error_rate=0.05, error_status=[500])
    await chaos.sleep(1)
    chaos.clear("p3")
    await phase("5 all providers down")
    for name in PROVIDERS:
        chaos.fault(name, refuse_connections=True)
    await chaos.sleep(1)
    await phase("6 recovery")
    chaos.clear(*PROVIDERS)
    await chaos.sleep(1)
    ids = [o.deferred for o in run.outcomes if o.deferred]
    run.mark(f"checking {len(ids)} deferred results")
    info["replay"] = await wait_replayed(replicas["r1"], ids, within_s=60)
    run.mark("deferred results fetched")
    await phase("7 Redis killed and restarted")
    await chaos.sleep(0.3)
    chaos.redis.kill()
    run.mark("redis killed")
    await chaos.sleep(0.35)
    chaos.redis.start()
    run.mark("redis restarted")
    await chaos.sleep(0.35)
    await phase("8 two replicas, p1 fails")
    weights[0] = 0.9  # a steady stream to replica 2 as well (10%)
    await chaos.sleep(0.1)
    chaos.fault("p1", error_rate=1.0, error_status=[500])
    await chaos.sleep(0.5)
    chaos.clear("p1")
    await chaos.sleep(0.4)
    del fleet
    return info


def first_after(
    transitions: list[tuple[float, str, str, str]],
    t: float,
    replica: str,
    provider: str,
    state: str,
) -> float | None:
    for when, rep, prov, st in transitions:
        if when >= t and rep == replica and prov == provider and st == state:
            return when
    return None


def breaker_times(run: Run) -> list[dict[str, Any]]:
    """For each outage mark: time to open (per provider), and from its recovery to closed."""
    out = []
    marks = run.marks
    for i, (t, what) in enumerate(marks):
        if not what.startswith("fault "):
            continue
        name = what.split()[1]
        recovered = next(
            (tr for tr, w in marks[i:] if w.startswith("recovered") and name in w.split()[1]), None
        )
        opened = first_after(run.transitions, t, "r1", name, "open")
        if opened is not None and recovered is not None and opened > recovered:
            opened = None
        closed = None
        if recovered is not None:
            closed = first_after(run.transitions, recovered, "r1", name, "closed")
        out.append(
            {
                "fault": what,
                "open_after_s": None if opened is None else round(opened - t, 3),
                "closed_after_recovery_s": None
                if closed is None or opened is None
                else round(closed - recovered, 3),
            }
        )
    return out


def propagation(run: Run) -> dict[str, Any]:
    """Phase 8: when each replica saw p1 open, and the gap between them."""
    start = next(t for t, w in run.marks if w.startswith("phase: 8"))
    one = first_after(run.transitions, start, "r1", "p1", "open")
    two = first_after(run.transitions, start, "r2", "p1", "open")
    gap = None if one is None or two is None else round(two - one, 3)
    return {"r1_open_at_s": one, "r2_open_at_s": two, "r2_after_r1_s": gap}


def phase_table(run: Run) -> list[dict[str, Any]]:
    rows = []
    for name in dict.fromkeys(o.phase for o in run.outcomes):
        got = [o for o in run.outcomes if o.phase == name]
        kinds = {
            k: sum(o.kind == k for o in got)
            for k in ("succeeded", "degraded", "shed", "failed", "lost")
        }
        answered = [o.latency_s for o in got if o.kind != "lost"]
        p50, p99 = percentiles(answered, (50.0, 99.0)) if answered else (float("nan"),) * 2
        sent = run.sent.get(name, 0)
        rows.append(
            {
                "phase": name,
                "sent": sent,
                **kinds,
                "no_answer": sent - len(got),
                "success_pct": round(100 * kinds["succeeded"] / max(1, sent), 2),
                "p50_ms": round(p50 * 1000, 1),
                "p99_ms": round(p99 * 1000, 1),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = [
        "phase",
        "sent",
        "succeeded",
        "degraded",
        "shed",
        "failed",
        "lost",
        "success_pct",
        "p50_ms",
        "p99_ms",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def targets(
    rows: list[dict[str, Any]], info: dict[str, Any], outcomes: list[Outcome]
) -> list[tuple[str, bool, str]]:
    """The benchmark's targets, each with whether it was met and the measured figure."""
    # "While a provider is healthy": requests neither sent nor finished during the total outage
    # (a stream in flight when every provider dies cannot be finished by anyone).
    healthy = [o for o in outcomes if not (o.phase.startswith("5") or o.ended.startswith("5"))]
    by_phase: dict[str, list[Outcome]] = {}
    for o in healthy:
        by_phase.setdefault(o.phase, []).append(o)
    pct = {
        p: 100 * sum(o.kind == "succeeded" for o in got) / len(got) for p, got in by_phase.items()
    }
    worst = min(pct, key=lambda p: pct[p])
    answered_all = all(r["lost"] == 0 and r["no_answer"] == 0 for r in rows)
    opens = [b["open_after_s"] for b in info["breakers"] if b["open_after_s"] is not None]
    closes = [
        b["closed_after_recovery_s"]
        for b in info["breakers"]
        if b["closed_after_recovery_s"] is not None
    ]
    redis_row = next(r for r in rows if r["phase"].startswith("7"))
    replay = info["replay"]
    gap = info["propagation"]["r2_after_r1_s"]
    return [
        (
            ">= 99.9% undegraded success while a provider is healthy",
            pct[worst] >= 99.9,
            f"worst {pct[worst]:.2f}% ({worst}, requests that met the total outage excluded)",
        ),
        ("every request answered (a status or a stream end), none lost", answered_all, "table"),
        ("breaker opens within 1 s", bool(opens) and max(opens) <= 1.0, f"opens {opens}"),
        (
            f"breaker closes within cooldown + 1 s (<= {info['max_cooldown_s'] + 1} s)",
            bool(closes) and max(closes) <= info["max_cooldown_s"] + 1,
            f"closes {closes}",
        ),
        ("Redis down: zero failed", redis_row["failed"] + redis_row["lost"] == 0, "phase 7"),
        (
            "every queued request replayed",
            bool(replay) and all(s == "done" for s in replay.values()),
            f"{sum(s == 'done' for s in replay.values())}/{len(replay)} done",
        ),
        ("replica 2 stops within 1 s of replica 1", gap is not None and gap <= 1.0, f"{gap} s"),
    ]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    run = Run()
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    redis = RedisServer()
    redis.start()
    fleet = spawn_fleet(FLEET)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {
            **{f"CHAOS_{n.upper()}": fleet.url(n) for n in PROVIDERS},
            "CHAOS_RULES": str(HERE / "chaos-rules"),
            "GATEWAY_POLICY": str(HERE / "chaos-policy.yaml"),
            "REDIS_URL": redis.url,
            "GATEWAY_REDIS_PREFIX": f"chaos:{uuid.uuid4().hex[:6]}:",
        }
        replicas: dict[str, str] = {}
        for name in ("r1", "r2"):
            proc, url = start_gateway(env, tmp / f"{name}.log")
            procs.append(proc)
            replicas[name] = url
        run.mark(f"gateways {replicas}, redis {redis.url}, logs in {tmp}")
        stop = asyncio.Event()
        weights = [1.0]
        urls = [replicas["r1"], replicas["r2"]]
        background = [
            asyncio.create_task(load(urls, weights, run, args.rate, stop)),
            asyncio.create_task(monitor(replicas, run, stop)),
        ]
        info = await phases(Chaos(fleet, redis, run, args.phase_s), replicas, weights)
        stop.set()
        await asyncio.gather(*background)
    finally:
        for proc in procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        fleet.close()
        redis.kill()
    logs = "".join((tmp / f"{n}.log").read_text(errors="replace") for n in ("r1", "r2"))
    info["breakers"] = breaker_times(run)
    info["propagation"] = propagation(run)
    info["max_cooldown_s"] = 4.0
    info["redis_log_lines"] = [ln for ln in logs.splitlines() if "redis" in ln.lower()]
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
            if o.kind in ("failed", "lost") or (o.kind == "degraded" and o.phase[0] not in "56")
        ],
        "marks": run.marks,
        "transitions": run.transitions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--phase-s", type=float, default=15.0, help="seconds per phase")
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
    print(f"- propagation (phase 8): {result['propagation']}")
    print(f"- replayed: {result['replay']}")
    print(f"- Redis log lines: {len(result['redis_log_lines'])}")
    print()
    for t in result["targets"]:
        print(f"- [{'x' if t['met'] else ' '}] {t['target']}: {t['measured']}")
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
