"""Scale test: 3 gateway replicas x 2 workers behind Debian's nginx, a local Redis Cluster
(3 masters + 3 replicas) as shared state, simulated providers behind.

    python -m loadtests.scale --out /tmp/scale [--seconds 10] [--clients 32]

Phases (one run, everything on 127.0.0.1, stops by itself):
1. throughput, zero-latency providers, closed loop: nginx -> 1 replica, then nginx -> 3 replicas;
2. limits and faults: providers that take ~70 ms per request, `max_inflight: 8` per member for the
   whole deployment, more clients than slots; one replica is killed (-9, all its processes) and
   later the Redis master holding the process registry is killed (-9).
Reported: requests/s and latency per phase, each member's peak concurrency as the simulator
counted it (must stay <= max_inflight), and every failed request, split into those in flight on
the killed replica at the kill (lost with it: nginx does not resend a POST it already sent) and
any other (must be none). Ports: Redis 7030-7035, nginx 7050/7051, replicas 7060-7062.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.redis_topology import missing_binaries, redis_cluster
from loadtests.simulator.testing import spawn_fleet

REDIS_PORTS = list(range(7030, 7036))
NGINX_ALL, NGINX_ONE = 7050, 7051
REPLICA_PORTS = [7060, 7061, 7062]
MAX_INFLIGHT = 8

POLICY = """
replicas: {{share_limits: true, heartbeat_s: 0.5, drain_s: 5}}
providers:
  zero-a: {{base_url: "{zero_a}", max_inflight: 100000}}
  zero-b: {{base_url: "{zero_b}", max_inflight: 100000}}
  lim-a: {{base_url: "{lim_a}", max_inflight: {limit}}}
  lim-b: {{base_url: "{lim_b}", max_inflight: {limit}}}
pools:
  zero: {{members: [zero-a, zero-b]}}
  limited:
    members: [lim-a, lim-b]
    queue: {{max_wait_s: 20, max_depth: 1000}}
models:
  fast: {{pool: zero}}
  limited: {{pool: limited}}
"""

NGINX = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream all {{
{servers}
    keepalive 64;
  }}
  upstream one {{
    server 127.0.0.1:{first};
    keepalive 64;
  }}
  map $upstream_addr $which {{ default $upstream_addr; }}
  server {{
    listen 127.0.0.1:{all_port};
    location / {{
      proxy_pass http://all;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_connect_timeout 1s;
      proxy_read_timeout 60s;
      # A replica that refuses connections is skipped; a POST already sent is never resent.
      proxy_next_upstream error timeout;
      add_header X-Upstream $upstream_addr always;
    }}
  }}
  server {{
    listen 127.0.0.1:{one_port};
    location / {{
      proxy_pass http://one;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      add_header X-Upstream $upstream_addr always;
    }}
  }}
}}
"""


@dataclass
class Replica:
    port: int
    proc: subprocess.Popen[bytes]

    def kill(self) -> None:
        """kill -9 the supervisor and its workers (the process group): a node dying."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def group_cpu_s(pgids: set[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes of these process groups."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) in pgids:  # pgrp
                total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def wait_http(url: str, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {timeout}s")


@contextlib.contextmanager
def replicas(policy: Path, redis_url: str, prefix: str, logs: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    env = {**os.environ, "REDIS_URL": redis_url, "GATEWAY_REDIS_PREFIX": prefix}
    try:
        for port in REPLICA_PORTS:
            out = (logs / f"replica-{port}.log").open("wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
                + ["--policy", str(policy), "--workers", "2", "--log-level", "warning"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            started.append(Replica(port, proc))
        for r in started:
            wait_http(f"http://127.0.0.1:{r.port}/ready")
        yield started
    finally:
        for r in started:
            if r.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, signal.SIGTERM)
        for r in started:
            try:
                r.proc.wait(15)
            except subprocess.TimeoutExpired:
                r.kill()


@contextlib.contextmanager
def nginx(tmp: Path) -> Iterator[None]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
        os.chmod(tmp / d, 0o777)
    servers = "\n".join(
        f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in REPLICA_PORTS
    )
    conf = tmp / "nginx.conf"
    conf.write_text(
        NGINX.format(
            tmp=tmp,
            servers=servers,
            first=REPLICA_PORTS[0],
            all_port=NGINX_ALL,
            one_port=NGINX_ONE,
        )
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-p", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "nginx.out").open("wb"),
    )
    try:
        wait_http(f"http://127.0.0.1:{NGINX_ALL}/health", 20)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Result:
    t: float
    status: int
    upstream: str
    latency: float


@dataclass
class Phase:
    name: str
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    events: dict[str, float] = field(default_factory=dict)
    gateway_cpu_s: float = 0.0
    machine_busy_share: float = 0.0

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.results if r.status == 200]
        lat = sorted(r.latency for r in ok)

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None

        by_upstream: dict[str, int] = {}
        for r in ok:
            by_upstream[r.upstream] = by_upstream.get(r.upstream, 0) + 1
        return {
            "requests": len(self.results),
            "ok": len(ok),
            "req_per_s": round(len(ok) / self.seconds, 1) if self.seconds else None,
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
            "by_replica": by_upstream,
            # (not with kills: a killed replica's CPU time leaves with it)
            "gateway_cores_used": round(self.gateway_cpu_s / self.seconds, 2)
            if self.seconds and not self.events
            else None,
            "gateway_cpu_ms_per_request": round(1000 * self.gateway_cpu_s / len(ok), 3)
            if ok and not self.events
            else None,
            "machine_busy_share": round(self.machine_busy_share, 2),
            "events_s": {k: round(v, 2) for k, v in self.events.items()},
        }


async def closed_loop(
    url: str,
    model: str,
    clients: int,
    seconds: float,
    phase: Phase,
    actions: list[tuple[float, Any]],
) -> None:
    start = time.monotonic()
    stop = start + seconds
    timeout = aiohttp.ClientTimeout(total=60)

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            body = {
                "model": model,
                "max_tokens": 10,
                "messages": [{"role": "user", "content": uuid.uuid4().hex}],
            }
            t0 = time.monotonic()
            try:
                async with session.post(url, json=body) as r:
                    await r.read()
                    status, up = r.status, r.headers.get("x-upstream", "")
            except (aiohttp.ClientError, TimeoutError) as e:
                status, up = 0, type(e).__name__
            phase.results.append(Result(t0 - start, status, up, time.monotonic() - t0))

    async def run_actions() -> None:
        for at, fn in actions:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            name = await asyncio.to_thread(fn)
            phase.events[name] = time.monotonic() - start

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(run_actions(), *(client(session) for _ in range(clients)))
    phase.seconds = time.monotonic() - start


def measure(phase: Phase, pgids: set[int], run: Any) -> None:
    cpu0, (busy0, total0) = group_cpu_s(pgids), machine_busy()
    run()
    phase.gateway_cpu_s = group_cpu_s(pgids) - cpu0
    busy1, total1 = machine_busy()
    phase.machine_busy_share = (busy1 - busy0) / max(1, total1 - total0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=10.0, help="per throughput phase")
    ap.add_argument("--fault-seconds", type=float, default=16.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument(
        "--kill",
        choices=["both", "replica", "master", "none"],
        default="both",
        help="faults of the limits phase",
    )
    a = ap.parse_args()
    why = missing_binaries() or (None if shutil.which("nginx") else "nginx not installed")
    if why:
        raise SystemExit(why)
    a.out.mkdir(parents=True, exist_ok=True)
    specs = [
        {"name": "zero-a", "profile": "zero-latency"},
        {"name": "zero-b", "profile": "zero-latency"},
    ] + [
        {
            "name": n,
            "profile": "fast",
            "overrides": {
                "max_batch": 256,
                "ttft_base_ms": 20,
                "decode_tps_alone": 200,
                "decode_tps_full": 200,
            },
        }
        for n in ("lim-a", "lim-b")
    ]
    report: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp_s, spawn_fleet(specs) as fleet:
        tmp = Path(tmp_s)
        policy = tmp / "policy.yaml"
        policy.write_text(
            POLICY.format(
                zero_a=fleet.url("zero-a"),
                zero_b=fleet.url("zero-b"),
                lim_a=fleet.url("lim-a"),
                lim_b=fleet.url("lim-b"),
                limit=MAX_INFLIGHT,
            )
        )
        prefix = f"scale-{uuid.uuid4().hex[:6]}:"
        with (
            redis_cluster(REDIS_PORTS, tmp / "redis") as cluster,
            replicas(policy, cluster.url, prefix, a.out) as reps,
            nginx(tmp / "nginx"),
        ):
            time.sleep(1.5)  # every process has seen every other (3 heartbeats)
            pgids = {r.proc.pid for r in reps}  # each replica leads its own process group
            phases: dict[str, Phase] = {}
            for name, port in (("1 replica", NGINX_ONE), ("3 replicas", NGINX_ALL)):
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                # warm-up, then the measured run
                asyncio.run(closed_loop(url, "fast", a.clients, 2, Phase("warm"), []))
                phase = phases[name] = Phase(name)
                measure(
                    phase,
                    pgids,
                    lambda url=url, phase=phase: asyncio.run(
                        closed_loop(url, "fast", a.clients, a.seconds, phase, [])
                    ),
                )
            for n in ("lim-a", "lim-b"):
                fleet.reset(n)
            victim = reps[-1]
            registry_key = prefix + "procs"

            def kill_replica() -> str:
                victim.kill()
                return f"replica {victim.port} killed"

            def kill_master() -> str:
                port = cluster.master_of(registry_key)
                cluster.kill(port)
                return f"redis master {port} killed"

            fault = Phase("faults")
            third = a.fault_seconds / 4
            measure(
                fault,
                pgids,
                lambda: asyncio.run(
                    closed_loop(
                        f"http://127.0.0.1:{NGINX_ALL}/v1/chat/completions",
                        "limited",
                        a.clients,
                        a.fault_seconds,
                        fault,
                        [(third, kill_replica)] * (a.kill in ("both", "replica"))
                        + [(2 * third, kill_master)] * (a.kill in ("both", "master")),
                    )
                ),
            )
            phases["faults"] = fault
            peaks = {n: fleet.stats(n)["active_peak"] for n in ("lim-a", "lim-b")}
    report["load_avg_after"] = os.getloadavg()
    report["phases"] = {k: p.summary() for k, p in phases.items()}
    report["member_peak_concurrency"] = peaks
    report["max_inflight"] = MAX_INFLIGHT
    kill_t = next((v for k, v in fault.events.items() if k.startswith("replica")), 1e9)
    victim_addr = f"127.0.0.1:{victim.port}"
    failed = [r for r in fault.results if r.status != 200]
    # Routed to the killed replica: in flight there when it died, or sent by nginx on a kept-alive
    # connection to it after it died (a POST already sent is not resent). Never accepted by a
    # surviving replica.
    to_victim = [r for r in failed if r.upstream.split(",")[-1].strip() == victim_addr]
    other = [r for r in failed if r not in to_victim]
    report["failed"] = {
        "in_flight_on_killed_replica": sum(r.t <= kill_t <= r.t + r.latency for r in to_victim),
        "sent_to_killed_replica_after": sum(r.t > kill_t for r in to_victim),
        "other": len(other),
        "other_detail": [
            {"t": round(r.t, 3), "status": r.status, "upstream": r.upstream} for r in other[:20]
        ],
    }
    one, three = report["phases"]["1 replica"], report["phases"]["3 replicas"]
    report["scaling_3_vs_1"] = round(three["req_per_s"] / one["req_per_s"], 2)
    (a.out / "scale.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
