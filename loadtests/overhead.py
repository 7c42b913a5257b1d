"""Gateway overhead, side by side in one run on loopback (one bounded command).

    python -m loadtests.overhead [--quick] [--out DIR] [--workers 1,2] [--modes unary,stream]
                                 [--wrk] [--soak-seconds 180] [--peer-venv /tmp/litellm-venv]
                                 [--floor] [--portkey .peers/portkey] [--baseline REV]

Starts two zero-latency simulator instances (a static upstream), then `gateway serve` with
loadtests/overhead.yaml (classification, routing and the exact cache on: every request carries a
unique nonce, so the exact-cache lookup runs and misses and the answer is stored) for each worker
count (2 workers share state through Redis under a unique key prefix), and runs
`python -m loadtests.bench overhead` (direct vs gateway, interleaved) for non-streaming and
streaming requests. It also runs the generator's own calibration, optionally two floors in front of
the same upstream (a byte relay and a bare uvicorn + aiohttp forwarder), Portkey's Node gateway
as a peer interleaved in every phase (installed by loadtests/peers/install_portkey.sh), optionally
LiteLLM's proxy as a peer (1 worker, from a separate virtualenv, its own phase) and a soak at half
the measured max throughput. `--baseline REV` also runs the gateway built from another commit
(same policy file of that commit) interleaved in every phase: the side-by-side old-vs-new check.
Everything lands in --out (one folder per phase plus summary.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtests.processes import free_port
from loadtests.simulator.testing import Fleet, spawn_fleet

ROOT = Path(__file__).resolve().parents[1]
POLICY = Path(__file__).with_name("overhead.yaml")
MODEL = "default"
BENCH_KEY = f"sk-overhead-{uuid.uuid4().hex}"


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early ({proc.returncode}): {proc.args!r}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout_s}s")


def child_pids(pid: int) -> list[int]:
    """Worker processes of a uvicorn supervisor (multiprocessing children, not its helpers)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for k in kids:
            cmd = Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"resource_tracker" not in cmd:
                out.append(int(k))
    return out


@contextlib.contextmanager
def process(
    cmd: list[str], env: dict[str, str], health: str, cwd: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            try:
                wait_http(health, proc)
            except RuntimeError:
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-3000:])
                raise
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def gateway(
    fleet: Fleet, workers: int, redis_url: str | None, root: Path = ROOT
) -> Iterator[tuple[str, list[int]]]:
    """`gateway serve` (the code under `root`) in front of the fleet.

    Yields (base URL, PIDs of the serving processes).
    """
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "OVERHEAD_URL_A": fleet.url("zero-a"),
        "OVERHEAD_URL_B": fleet.url("zero-b"),
    }
    env.pop("REDIS_URL", None)
    if workers > 1:
        if not redis_url:
            raise SystemExit("--workers > 1 needs Redis (--redis-url) to share state")
        env["REDIS_URL"] = redis_url
        env["GATEWAY_REDIS_PREFIX"] = f"overhead-{uuid.uuid4().hex[:8]}:"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    policy = root / POLICY.relative_to(ROOT)
    cmd += ["--policy", str(policy), "--workers", str(workers), "--log-level", "warning"]
    with process(cmd, env, f"http://127.0.0.1:{port}/health", cwd=root) as proc:
        pids = [proc.pid]
        if workers > 1:
            deadline = time.monotonic() + 30
            while len(pids := child_pids(proc.pid)) < workers and time.monotonic() < deadline:
                time.sleep(0.2)
        # Warm every worker's connection pool and imports before measuring.
        for _ in range(20 * workers):
            post(f"http://127.0.0.1:{port}/v1/chat/completions")
        yield f"http://127.0.0.1:{port}/v1", pids
        if workers > 1:
            _clear_redis(redis_url, env["GATEWAY_REDIS_PREFIX"])


def _clear_redis(url: str | None, prefix: str) -> None:
    with contextlib.suppress(Exception):
        import redis

        r = redis.Redis.from_url(url or "")
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)


def post(url: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
    ).encode()
    h = {"content-type": "application/json", "authorization": f"Bearer {BENCH_KEY}"}
    req = urllib.request.Request(url, body, {**h, **(headers or {})})
    with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=10) as r:
        r.read()


@contextlib.contextmanager
def litellm_peer(venv: Path, fleet: Fleet) -> Iterator[tuple[str, int] | None]:
    """LiteLLM's proxy (1 worker) in front of zero-a, or None when it is not installed."""
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        print(f"peer: {exe} not found; running without a peer", file=sys.stderr)
        yield None
        return
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "litellm.yaml"
        cfg.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            "      model: openai/sim-small\n"
            f"      api_base: {fleet.url('zero-a')}\n"
            "      api_key: unused\n"
            "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
        )
        env = {
            **os.environ,
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_MASTER_KEY": BENCH_KEY,  # the gateway and the simulator ignore the key
        }
        cmd = [str(exe), "--config", str(cfg), "--port", str(port), "--num_workers", "1"]
        try:
            ctx = process(cmd, env, f"http://127.0.0.1:{port}/health/liveliness")
            proc = ctx.__enter__()
        except RuntimeError as e:
            print(f"peer: LiteLLM did not start ({e}); running without a peer", file=sys.stderr)
            yield None
            return
        try:
            yield f"http://127.0.0.1:{port}/v1", proc.pid
        finally:
            ctx.__exit__(None, None, None)


@contextlib.contextmanager
def portkey_peer(install: Path, fleet: Fleet) -> Iterator[list[str]]:
    """Portkey's gateway (one Node process) in front of zero-a; yields the bench arguments."""
    server = install / "node_modules/@portkey-ai/gateway/build/start-server.js"
    if not server.exists() or shutil.which("node") is None:
        print(f"peer: {server} or node not found; running without Portkey", file=sys.stderr)
        yield []
        return
    port = free_port()
    cmd = ["node", str(server), f"--port={port}", "--headless"]
    with process(cmd, dict(os.environ), f"http://127.0.0.1:{port}/") as proc:
        for _ in range(20):
            post(f"http://127.0.0.1:{port}/v1/chat/completions", portkey_headers(fleet))
        args = ["--peer", f"portkey=http://127.0.0.1:{port}/v1", "--pid", f"portkey={proc.pid}"]
        for k, v in portkey_headers(fleet).items():
            args += ["--target-header", f"portkey={k}:{v}"]
        yield args


@contextlib.contextmanager
def floors(fleet: Fleet) -> Iterator[list[str]]:
    """Two floors in front of zero-a: a byte relay (loadtests.tcp_relay: one extra hop) and the
    gateway's serving stack with nothing in it (loadtests.stack_floor: uvicorn + aiohttp)."""
    port = free_port()
    upstream = fleet.root_url("zero-a").removeprefix("http://")
    cmd = [sys.executable, "-m", "loadtests.tcp_relay", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--to", upstream]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port2 = free_port()
    cmd2 = [sys.executable, "-m", "loadtests.stack_floor", "--port", str(port2)]
    cmd2 += ["--upstream", fleet.root_url("zero-a")]
    with (
        process(cmd, env, f"http://127.0.0.1:{port}/health") as relay,
        process(cmd2, env, f"http://127.0.0.1:{port2}/health") as stack,
    ):
        yield [
            *("--peer", f"relay=http://127.0.0.1:{port}/v1", "--pid", f"relay={relay.pid}"),
            *("--peer", f"stack=http://127.0.0.1:{port2}/v1", "--pid", f"stack={stack.pid}"),
        ]


@contextlib.contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """The gateway's code at another commit (``git archive``), for old-vs-new runs."""
    with tempfile.TemporaryDirectory(prefix="overhead-baseline-") as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


@contextlib.contextmanager
def baseline_peer(
    tree: Path | None, fleet: Fleet, workers: int, redis_url: str | None
) -> Iterator[list[str]]:
    """The same gateway set-up built from the baseline commit, measured as a peer."""
    if tree is None:
        yield []
        return
    with gateway(fleet, workers, redis_url, root=tree) as (url, pids):
        yield ["--peer", f"baseline={url}", *pid_args(pids, "baseline")]


def portkey_headers(fleet: Fleet) -> dict[str, str]:
    """Portkey's per-request routing: an OpenAI-compatible provider at the simulator's URL."""
    return {"x-portkey-provider": "openai", "x-portkey-custom-host": fleet.url("zero-a")}


def bench(args: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """One `python -m loadtests.bench` run; returns its result.json."""
    cmd = [sys.executable, "-m", "loadtests.bench", *args, "--quiet", "--out", str(out)]
    cmd += ["--model", MODEL, "--no-plots", "--api-key", BENCH_KEY]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=timeout_s)
    return json.loads((out / "result.json").read_text())


def pid_args(pids: list[int], name: str = "gateway") -> list[str]:
    if len(pids) == 1:
        return ["--pid", f"{name}={pids[0]}"]
    return [a for i, p in enumerate(pids) for a in ("--pid", f"{name}{i + 1}={p}")]


def overhead_args(a: argparse.Namespace, stream: bool) -> list[str]:
    if a.quick:
        sizes = ["--rounds", "2", "--one-client-requests", "100", "--rate-seconds", "4"]
        sizes += ["--concurrency", "1,16,64", "--step-seconds", "2"]
    else:
        sizes = ["--rounds", "5", "--one-client-requests", "500", "--rate-seconds", "10"]
        sizes += ["--concurrency", "1,8,32,64,128", "--step-seconds", "4"]
    return [*sizes, "--rates", a.rates, "--stream" if stream else "--no-stream"]


def max_rps(result: dict[str, Any], target: str) -> float:
    for row in result["tables"].get("max_throughput", []):
        if row["target"] == target:
            return float(row["max_req_per_s"])
    return math.nan


def run(a: argparse.Namespace) -> None:
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    budget = 1800.0
    results["calibrate"] = bench(
        ["calibrate", "--seconds", "2" if a.quick else "3"],
        out / "calibrate",
        budget,
    )
    fleet = spawn_fleet(
        [
            {"name": "zero-a", "profile": "zero-latency"},
            {"name": "zero-b", "profile": "zero-latency"},
        ]
    )
    stack0 = contextlib.ExitStack()
    tree = stack0.enter_context(baseline_tree(a.baseline)) if a.baseline else None
    try:
        direct = fleet.url("zero-a")
        sim_pid = ["--pid", f"simulator={fleet.pid}"] if fleet.pid else []
        for workers in a.workers:
            with (
                gateway(fleet, workers, a.redis_url) as (url, pids),
                contextlib.ExitStack() as stack,
            ):
                peer_args = stack.enter_context(floors(fleet)) if a.floor else []
                peer_args += stack.enter_context(baseline_peer(tree, fleet, workers, a.redis_url))
                if a.portkey:
                    peer_args += stack.enter_context(portkey_peer(a.portkey, fleet))
                for mode in a.modes:
                    args = ["overhead", "--direct", direct, "--gateway", url, *peer_args]
                    args += [*pid_args(pids), *sim_pid, *overhead_args(a, mode == "stream")]
                    if a.wrk:
                        args.append("--wrk")
                    name = f"w{workers}-{mode}"
                    results[name] = bench(args, out / name, budget)
                if workers == 1 and a.peer_venv:
                    # Its own run: a peer that falls behind keeps working through its backlog
                    # and would slow the gateway's phases if they were interleaved with it.
                    with litellm_peer(a.peer_venv, fleet) as peer:
                        if peer is not None:
                            args = ["overhead", "--direct", direct, "--gateway", url]
                            args += ["--peer", peer[0], "--pid", f"peer={peer[1]}"]
                            args += [*pid_args(pids), *sim_pid, "--rounds", "2"]
                            args += ["--one-client-requests", "100", "--rates", a.peer_rates]
                            args += ["--rate-seconds", "4", "--concurrency", "1,4,16"]
                            args += ["--step-seconds", "3", "--no-stream"]
                            results["w1-unary-peer"] = bench(args, out / "w1-unary-peer", budget)
                if workers == 1 and a.soak_seconds > 0 and "w1-unary" in results:
                    rate = max(10.0, 0.5 * max_rps(results["w1-unary"], "gateway"))
                    soak = ["soak", "--url", url, "--rate", f"{rate:.0f}"]
                    soak += ["--duration", str(a.soak_seconds), "--window", "10", *pid_args(pids)]
                    # The duration, not the default request cap, must end the soak.
                    soak += ["--max-requests", str(int(rate * a.soak_seconds * 1.2) + 1000)]
                    results["w1-soak"] = bench(soak, out / "w1-soak", a.soak_seconds + 300)
    finally:
        fleet.close()
        stack0.close()
    (out / "summary.md").write_text(summarize(results))
    print((out / "summary.md").read_text())


def _f(v: Any, nd: int = 2) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(x) else f"{x:.{nd}f}"


def summarize(results: dict[str, dict[str, Any]]) -> str:
    """One markdown table per run, with the figures the overhead targets name."""
    lines = ["# Gateway overhead", ""]
    cal = results.get("calibrate")
    if cal:
        lines += [f"- generator: {n}" for n in cal.get("notes", [])] + [""]
    for name, res in results.items():
        if res.get("mode") != "overhead":
            continue
        t = res["tables"]
        sides = [n for n in res.get("config", {}).get("targets", {}) if n != "direct"]
        lines += [f"## {name}", "", "| figure | " + " | ".join(sides) + " |"]
        lines.append("|---|" + "---|" * len(sides))

        def added(rows: list[dict[str, Any]], target: str, key: str) -> str:
            row = next((r for r in rows if r["target"] == target), None)
            return _f(row.get(f"added_{key}")) if row else "-"

        for label, rows in [("one client", t["one_client"])] + [
            (f"{r:g} req/s", [x for x in t["rates"] if x["rate"] == r])
            for r in sorted({x["rate"] for x in t["rates"]})
        ]:
            for q in ("p50", "p99"):
                key = f"lat_{q}_ms"
                cells = " | ".join(added(rows, side, key) for side in sides)
                lines.append(f"| added {q} ms, {label} | {cells} |")
        mx = {r["target"]: r for r in t["max_throughput"]}
        cells = " | ".join(_f(mx.get(side, {}).get("max_req_per_s"), 0) for side in sides)
        direct_max = _f(mx.get("direct", {}).get("max_req_per_s"), 0)
        lines.append(f"| max req/s (direct {direct_max}) | {cells} |")
        lines += _proc_lines(t["process"], sides)
        lines += [""] + [f"- {n}" for n in res.get("notes", [])] + [""]
    soak = results.get("w1-soak")
    if soak:
        cfg = soak.get("config", {})
        lines += [
            f"## soak (1 worker, {_f(cfg.get('rate'), 0)} req/s for {cfg.get('duration_s')} s)",
            "",
            "| metric | first window | last window | ratio |",
            "|---|---|---|---|",
        ]
        for row in soak["tables"].get("drift", []):
            lines.append(
                f"| {row['metric']} | {_f(row['first'])} | {_f(row['last'])} | {_f(row['ratio'])} |"
            )
        for row in soak["tables"].get("overall", []):
            lines.append(
                f"| overall p50 / p99 ms | {_f(row.get('lat_p50_ms'))} | "
                f"{_f(row.get('lat_p99_ms'))} | errors {row.get('errors')} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _proc_lines(rows: list[dict[str, Any]], sides: list[str]) -> list[str]:
    """CPU ms/request and RSS of each side's processes during its max-throughput steps.

    A side's processes are those metered under its name (``gateway``, ``gateway1``...).
    """
    cpu: dict[str, float] = {}
    n: dict[str, float] = {}
    rss: dict[str, float] = {}
    procs: dict[str, set[str]] = {}
    for r in rows:
        side, proc = r["target"], r["process"]
        if not r["phase"].startswith("c=") or side not in sides or not proc.startswith(side):
            continue
        per = float(r["cpu_ms_per_request"])
        if math.isnan(per) or per <= 0:
            continue
        cpu[side] = cpu.get(side, 0.0) + float(r["cpu_s"])
        n[side] = n.get(side, 0.0) + float(r["cpu_s"]) * 1000 / per
        rss[side] = max(rss.get(side, 0.0), float(r["rss_mb"]))
        procs.setdefault(side, set()).add(proc)
    per_req = {k: 1000 * cpu[k] * len(procs[k]) / n[k] for k in cpu if n.get(k)}
    return [
        "| CPU ms/request (closed-loop steps) | "
        + " | ".join(_f(per_req.get(side), 3) for side in sides)
        + " |",
        "| RSS MB per process (max) | " + " | ".join(_f(rss.get(side), 0) for side in sides) + " |",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("overhead-results"))
    p.add_argument("--quick", action="store_true", help="Short phases (a smoke run, ~3 min).")
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--modes", type=lambda s: s.split(","), default=["unary", "stream"])
    p.add_argument("--rates", default="200,500")
    p.add_argument("--wrk", action="store_true", help="Max throughput with wrk (if installed).")
    p.add_argument("--soak-seconds", type=int, default=0, help="Soak at 50%% of max; 0 = none.")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--peer-venv", type=Path, default=None, help="Virtualenv with litellm[proxy].")
    p.add_argument("--peer-rates", default="50", help="Open-loop rates of the LiteLLM run.")
    p.add_argument(
        "--floor",
        action="store_true",
        help="Also measure a byte relay and a bare uvicorn + aiohttp forwarder (floors).",
    )
    p.add_argument(
        "--portkey",
        type=Path,
        default=None,
        help="Portkey install (loadtests/peers/install_portkey.sh DIR) to run as a peer.",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="REV",
        help="Also run the gateway built from commit REV as a peer (old vs new, interleaved).",
    )
    a = p.parse_args()
    if a.wrk and shutil.which("wrk") is None:
        raise SystemExit("--wrk given but wrk is not installed (apt-get install -y wrk)")
    run(a)


if __name__ == "__main__":
    main()
