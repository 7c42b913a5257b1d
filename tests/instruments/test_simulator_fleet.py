"""Provider simulator: profiles file, fleet file, command line and the child-process fleet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from loadtests.simulator.fleet import READY_PREFIX
from loadtests.simulator.profiles import (
    InstanceSpec,
    load_fleet_file,
    load_profiles,
    resolve_profile,
)
from loadtests.simulator.testing import spawn_fleet

ROOT = Path(__file__).resolve().parents[2]
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_profiles_file_has_the_documented_profiles() -> None:
    profiles = load_profiles()
    assert {"low-latency", "big-batch", "zero-latency", "fast"} <= set(profiles)
    ll, bb = profiles["low-latency"], profiles["big-batch"]
    assert (ll.max_batch, ll.decode_tps_alone, ll.decode_tps_full) == (8, 80, 40)
    assert (bb.max_batch, bb.decode_tps_alone, bb.decode_tps_full) == (64, 30, 15)
    assert profiles["zero-latency"].zero_latency


def test_overrides_and_speed_factor() -> None:
    spec = InstanceSpec(name="x", profile="low-latency", speed=0.5, overrides={"max_batch": 4})
    p = resolve_profile(spec)
    assert p.max_batch == 4 and p.decode_tps_alone == 40 and p.ttft_base_ms == 40
    with pytest.raises(ValidationError):
        resolve_profile(InstanceSpec(name="x", overrides={"no_such_field": 1}))
    with pytest.raises(ValueError):
        resolve_profile(InstanceSpec(name="x", profile="nope"))


def test_shipped_fleet_files_are_valid() -> None:
    paths = sorted(ROOT.glob("loadtests/fleet*.yaml"))
    assert paths, "no loadtests/fleet*.yaml found"
    for path in paths:
        ff = load_fleet_file(path)
        assert ff.instances, path
        for spec in ff.instances:
            assert resolve_profile(spec) is not None


def test_spawned_fleet_process_starts_fast_and_is_controllable() -> None:
    t0 = time.perf_counter()
    with spawn_fleet(
        [{"name": "a", "profile": "fast"}, {"name": "z", "profile": "zero-latency"}]
    ) as fleet:
        started = time.perf_counter() - t0
        assert started < 3.0, started  # ~0.3 s on an idle machine
        r = httpx.post(fleet.url("z") + "/chat/completions", json=BODY)
        assert r.status_code == 200 and r.headers["x-sim-instance"] == "z"
        fleet.set_faults("a", refuse_connections=True)
        with pytest.raises(httpx.ConnectError):
            httpx.post(fleet.url("a") + "/chat/completions", json=BODY)
        fleet.clear_faults("a")
        assert httpx.post(fleet.url("a") + "/chat/completions", json=BODY).status_code == 200
        assert fleet.stats("a")["requests"] == 1
        assert fleet.faults("a")["refuse_connections"] is False


def test_command_line_fleet_file_and_sigterm(tmp_path: Path) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "admin_port: 0\ninstances:\n"
        "  - {name: one, profile: fast, port: 0}\n"
        "  - {name: two, profile: low-latency, port: 0, speed: 4}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "loadtests.simulator",
        "fleet",
        "--file",
        str(fleet_file),
        "--ready-line",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(READY_PREFIX):
                break
        ready = json.loads(lines[-1][len(READY_PREFIX) :])
        assert any("one" in x and "/v1" in x for x in lines[:-1])
        r = httpx.post(ready["instances"]["two"] + "/chat/completions", json=BODY, timeout=5)
        assert r.status_code == 200 and r.headers["x-sim-instance"] == "two"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
