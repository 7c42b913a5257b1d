"""Harness of the routing benchmarks: workloads, the processes under test, open-loop sending and
the figures taken from the samples. The fleets and policies sit next to this file."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from loadtests.bench.client import NAN, Client, Sample, Target
from loadtests.bench.engine import open_loop
from loadtests.bench.prompts import chat_body, make_prompt
from loadtests.bench.schedule import poisson_times
from loadtests.bench.stats import percentile_sorted
from loadtests.processes import free_port
from loadtests.simulator.profiles import load_fleet_file
from loadtests.simulator.testing import Fleet, spawn_fleet

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LITELLM_KEY = "sk-routing-bench-0123456789abcdef0123456789abcdef"
SLO_TTFT_S = 1.0


@dataclass(frozen=True, slots=True)
class Req:
    offset: float
    tag: str
    body: bytes


# -- workloads --------------------------------------------------------------------------------------
def mixed_workload(rate: float, duration: float, seed: int = 1, warmup_s: float = 0.0) -> list[Req]:
    """80% short (prompt 50-300, output 20-150 tokens), 20% long (prompt 2k-8k, output 300-1000).

    Requests scheduled before `warmup_s` are tagged "warmup-short"/"warmup-long": they bring the
    members to a steady load (long generations last 10-60 s) and are left out of the figures.
    """
    rng = random.Random(seed)
    out = []
    for t in poisson_times(rate, duration, seed=seed):
        if rng.random() < 0.8:
            tag, prompt, output = "short", rng.randint(50, 300), rng.randint(20, 150)
        else:
            tag, prompt, output = "long", rng.randint(2000, 8000), rng.randint(300, 1000)
        if t < warmup_s:
            tag = f"warmup-{tag}"
        out.append(Req(t, tag, chat_body("chat", make_prompt(prompt, rng), output, True)))
    return out


def short_workload(rate: float, duration: float, seed: int = 2) -> list[Req]:
    rng = random.Random(seed)
    return [
        Req(
            t,
            "short",
            chat_body("chat", make_prompt(rng.randint(50, 300), rng), rng.randint(20, 150), True),
        )
        for t in poisson_times(rate, duration, seed=seed)
    ]


def prefix_workload(
    rate: float, duration: float, hot_share: float | None = None, seed: int = 3
) -> list[Req]:
    """20 system prompts of ~2k tokens with Zipf popularity (or one taking `hot_share`), short
    unique user turns, short answers."""
    rng = random.Random(seed)
    systems = [
        f"System prompt {k}: " + make_prompt(2000, random.Random(100 + k), False) for k in range(20)
    ]
    zipf = [1.0 / (k + 1) for k in range(20)]
    out = []
    for t in poisson_times(rate, duration, seed=seed):
        if hot_share is not None and rng.random() < hot_share:
            k = 0
        else:
            k = rng.choices(range(20), zipf)[0] if hot_share is None else rng.randrange(1, 20)
        body = {
            "model": "chat",
            "messages": [
                {"role": "system", "content": systems[k]},
                {"role": "user", "content": make_prompt(rng.randint(10, 40), rng)},
            ],
            "max_tokens": rng.randint(16, 48),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(Req(t, "short", orjson.dumps(body)))
    return out


# -- processes --------------------------------------------------------------------------------------
def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def process(
    cmd: list[str], health: str, env: dict[str, str], log: Path, timeout: float
) -> Iterator[None]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_http(health, proc, timeout)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fleet_env(fleet: Fleet) -> dict[str, str]:
    return {f"SIM_URL_{n.upper().replace('-', '_')}": fleet.url(n) for n in fleet.names}


@contextlib.contextmanager
def start_fleet(name: str) -> Iterator[Fleet]:
    spec = load_fleet_file(HERE / f"fleet-{name}.yaml")
    with spawn_fleet(spec.instances) as fleet:
        yield fleet


@contextlib.contextmanager
def gateway(policy: str, fleet: Fleet, workdir: Path, **env: str) -> Iterator[Target]:
    """`gateway serve` on a policy file from loadtests/routing, pointed at the fleet."""
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    cmd += ["--policy", str(HERE / f"policy-{policy}.yaml"), "--log-level", "warning"]
    penv = {**fleet_env(fleet), **env, "PYTHONPATH": str(ROOT)}
    with process(cmd, f"http://127.0.0.1:{port}/health", penv, workdir / "gateway.log", 30):
        yield Target("gateway", f"http://127.0.0.1:{port}/v1", "chat")


@contextlib.contextmanager
def litellm(binary: str, strategy: str, fleet: Fleet, workdir: Path) -> Iterator[Target]:
    """The LiteLLM proxy over the same members (openai-compatible deployments of one model)."""
    cfg = {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {
                    "model": "openai/sim",
                    "api_base": fleet.url(n),
                    "api_key": "none",
                    "timeout": 900,
                    "stream_timeout": 900,
                },
            }
            for n in fleet.names
        ],
        "router_settings": {"routing_strategy": strategy, "num_retries": 0},
        "litellm_settings": {"telemetry": False, "request_timeout": 900},
        "general_settings": {"master_key": LITELLM_KEY},
    }
    path = workdir / f"litellm-{strategy}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    cmd = [binary, "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    with process(
        cmd, f"http://127.0.0.1:{port}/health/liveliness", env, workdir / "litellm.log", 120
    ):
        yield Target(f"litellm-{strategy}", f"http://127.0.0.1:{port}/v1", "chat", LITELLM_KEY)


def wait_idle(fleet: Fleet, timeout: float = 90.0) -> bool:
    """Wait until no instance has a request in flight (a cut stream may take a moment to stop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(fleet.stats(n)["in_flight"] == 0 for n in fleet.names):
            return True
        time.sleep(0.25)
    return False


# -- sending ----------------------------------------------------------------------------------------
async def _send_all(
    target: Target, reqs: list[Req], cut_longs: bool, drain_s: float
) -> list[Sample]:
    """Open loop over `reqs`. With `cut_longs`, long streams still running once every short request
    has finished are cut (recorded with error "cut", not counted as failures)."""
    samples: list[Sample] = []
    shorts_left = [sum(1 for r in reqs if r.tag.endswith("short"))]
    shorts_done = asyncio.Event()
    if shorts_left[0] == 0:
        shorts_done.set()
    async with Client(max_connections=4096, timeout_s=900) as client:

        async def fire(i: int, scheduled: float) -> Sample:
            r = reqs[i]
            send = asyncio.ensure_future(client.send(target, r.body, True, scheduled, r.tag))
            if cut_longs and not r.tag.endswith("short"):
                stop = asyncio.ensure_future(shorts_done.wait())
                await asyncio.wait([send, stop], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not send.done():
                    send.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await send
                    return Sample(
                        target.name, r.tag, scheduled, scheduled, NAN, NAN, 0, "cut", 0, 0
                    )
            s = await send
            if r.tag.endswith("short"):
                shorts_left[0] -= 1
                if shorts_left[0] == 0:
                    shorts_done.set()
            return s

        await open_loop(fire, samples.append, [r.offset for r in reqs], drain_s=drain_s)
    return samples


def send_all(
    target: Target, reqs: list[Req], cut_longs: bool = False, drain_s: float = 180.0
) -> list[Sample]:
    return asyncio.run(_send_all(target, reqs, cut_longs, drain_s))


def p(values: list[float], q: float) -> float:
    return percentile_sorted(sorted(values), q) if values else math.nan


def summary(samples: list[Sample]) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": len(samples)}
    for tag in sorted({s.tag for s in samples}):
        mine = [s for s in samples if s.tag == tag]
        ok = [s for s in mine if s.error is None]
        ttft = [s.ttft for s in ok if not math.isnan(s.first)]
        out[tag] = {
            "n": len(mine),
            "errors": sum(1 for s in mine if s.error not in (None, "cut")),
            "cut": sum(1 for s in mine if s.error == "cut"),
            "ttft_p50_s": p(ttft, 50),
            "ttft_p99_s": p(ttft, 99),
            "ttft_mean_s": sum(ttft) / len(ttft) if ttft else math.nan,
            "latency_p50_s": p([s.latency for s in ok], 50),
            "latency_p99_s": p([s.latency for s in ok], 99),
        }
    return out


def meets_slo(s: dict[str, Any]) -> bool:
    short, long = s.get("short", {}), s.get("long", {"errors": 0})
    return short.get("errors", 1) == 0 and long["errors"] == 0 and short["ttft_p99_s"] <= SLO_TTFT_S


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
