"""What observability costs per request: tracing on vs off, metrics + access log on vs off.

Run: PYTHONPATH=. python -m loadtests.observability_cost [--rounds 5] [--latency-requests 300]
     [--cpu-requests 2000] [--concurrency 8]

Five `gateway serve` processes (one per setting) sit in front of one zero-latency simulated
provider (child process); a fifth target is the provider itself. Traces go over OTLP/HTTP to a
local sink process that accepts and discards them (so the exporter's encoding and sending count).
Targets are interleaved round by round, the order rotated each round, so machine noise hits each
alike. Reported per setting:

- p50/p99 latency at one client (sequential requests) and the p50 added over the direct provider;
- gateway CPU time per request (from /proc, user + system) during a closed loop at `--concurrency`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

from loadtests.bench.client import Client, Sample, Target
from loadtests.bench.engine import closed_loop
from loadtests.bench.procstat import read_proc
from loadtests.bench.stats import percentiles
from loadtests.simulator.testing import spawn_fleet

OFF = {"GATEWAY_METRICS": "0", "GATEWAY_ACCESS_LOG": "0", "OTEL_TRACES_EXPORTER": "none"}
SETTINGS: dict[str, dict[str, str]] = {
    "all off": OFF,
    "metrics+log": {**OFF, "GATEWAY_METRICS": "1", "GATEWAY_ACCESS_LOG": "1"},
    "tracing": {**OFF, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"},
    "tracing 10%": {
        **OFF,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
    "all on": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"},
}


class _Sink(http.server.BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP exports and drops them."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _policy(upstream: str) -> str:
    return f"""
providers:
  zero: {{base_url: '{upstream}', models: {{'*': sim}}, max_inflight: 512}}
pools:
  main: {{members: [zero]}}
models:
  chat: {{pool: main}}
"""


@contextlib.contextmanager
def _process(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Body:
    """Unique prompts, sampled (temperature 1): no cache can answer."""

    def __call__(self) -> bytes:
        prompt = f"{uuid.uuid4().hex} Tell me something about gateways."
        return orjson.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
        )


async def _measure(
    targets: list[Target], pids: dict[str, int], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    body = Body()
    lat: dict[str, list[Sample]] = {t.name: [] for t in targets}
    cpu: dict[str, float] = dict.fromkeys(pids, 0.0)
    cpu_n: dict[str, int] = dict.fromkeys(pids, 0)
    errors = 0
    async with Client(max_connections=64) as client:
        for t in targets:  # warm-up: connections, caches, first-use imports
            for _ in range(50):
                await client.send(t, body(), False)
        for r in range(args.rounds):
            k = r % len(targets)
            for t in targets[k:] + targets[:k]:
                per = args.latency_requests // args.rounds
                for _ in range(per):
                    s = await client.send(t, body(), False)
                    errors += s.error is not None
                    lat[t.name].append(s)
                if t.name not in pids:
                    continue
                before = read_proc(pids[t.name]).cpu_s
                samples: list[Sample] = []
                await closed_loop(
                    lambda t=t: client.send(t, body(), False),
                    samples.append,
                    args.concurrency,
                    600.0,
                    args.cpu_requests // args.rounds,
                )
                cpu[t.name] += read_proc(pids[t.name]).cpu_s - before
                cpu_n[t.name] += len(samples)
                errors += sum(s.error is not None for s in samples)
    if errors:
        print(f"warning: {errors} requests failed", file=sys.stderr)
    out: dict[str, dict[str, float]] = {}
    for name, samples in lat.items():
        p50, p99 = percentiles([s.latency * 1000 for s in samples if s.error is None], [50, 99])
        row = {"p50_ms": p50, "p99_ms": p99, "n": float(len(samples))}
        if name in pids and cpu_n[name]:
            row["cpu_ms_per_request"] = 1000 * cpu[name] / cpu_n[name]
        out[name] = row
    return out


def _report(rows: dict[str, dict[str, float]]) -> str:
    direct = rows["direct"]["p50_ms"]
    base = rows["all off"]
    lines = [
        "| setting | p50 ms | p99 ms | p50 added vs direct ms | vs all off ms "
        "| gateway CPU ms/req | vs all off |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        cpu = r.get("cpu_ms_per_request")
        lines.append(
            f"| {name} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['p50_ms'] - direct:+.3f} | "
            + ("" if name == "direct" else f"{r['p50_ms'] - base['p50_ms']:+.3f}")
            + " | "
            + ("" if cpu is None else f"{cpu:.3f}")
            + " | "
            + ("" if cpu is None else f"{cpu - base['cpu_ms_per_request']:+.3f}")
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--latency-requests", type=int, default=300, help="per target, all rounds")
    p.add_argument("--cpu-requests", type=int, default=2000, help="per gateway, all rounds")
    p.add_argument("--concurrency", type=int, default=8, help="closed loop for the CPU phase")
    p.add_argument("--sink", type=int, help=argparse.SUPPRESS)  # internal: run the OTLP sink
    args = p.parse_args(argv)
    if args.sink:
        http.server.ThreadingHTTPServer(("127.0.0.1", args.sink), _Sink).serve_forever()
        return
    tmp = Path(tempfile.mkdtemp(prefix="obs-cost-"))
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(spawn_fleet([{"name": "zero", "profile": "zero-latency"}]))
        policy = tmp / "policy.yaml"
        policy.write_text(_policy(fleet.url("zero")))
        sink_port = _free_port()
        sink_cmd = [sys.executable, "-m", "loadtests.observability_cost", "--sink", str(sink_port)]
        stack.enter_context(_process(sink_cmd, {}, tmp / "sink.log"))
        targets = [Target("direct", fleet.url("zero"), "chat")]
        pids: dict[str, int] = {}
        for name, env in SETTINGS.items():
            port = _free_port()
            env = {
                **env,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                "PYTHONPATH": os.getcwd(),
            }
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            cmd += ["--policy", str(policy), "--log-level", "warning"]
            log = tmp / f"gateway-{name.replace(' ', '_').replace('+', '_')}.log"
            proc = stack.enter_context(_process(cmd, env, log))
            _wait(f"http://127.0.0.1:{port}/health")
            targets.append(Target(name, f"http://127.0.0.1:{port}/v1", "chat"))
            pids[name] = proc.pid
        rows = asyncio.run(_measure(targets, pids, args))
    print(
        f"rounds={args.rounds} latency_requests={args.latency_requests} "
        f"cpu_requests={args.cpu_requests} concurrency={args.concurrency} logs={tmp}"
    )
    print(_report(rows))


if __name__ == "__main__":
    main()
