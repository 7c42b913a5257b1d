"""The built-in demo (`gateway serve` with no policy) and its simulated fleet, a child process,
under signals sent to a real process group: a SIGHUP to the whole group (a terminal closed,
`kill -HUP -PGID`) reloads the gateway and leaves the fleet serving (it once killed the fleet,
the gateway then serving over nothing); SIGINT to the group (Ctrl-C) or SIGTERM to the gateway
stop it, and no child is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import free_port, wait_http


def children_of(pid: int) -> set[int]:
    """Every process descended from `pid` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = {pid}
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in found and child not in found:
                found.add(child)
                grew = True
    return found - {pid}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited


def fleet_pids(pid: int) -> set[int]:
    out = set()
    for p in children_of(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"loadtests.simulator" in cmd:
            out.add(p)
    return out


def ask(url: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)
    answer = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return answer.choices[0].message.content or ""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize(
    ("workers", "stop", "to_group"),
    [(1, signal.SIGINT, True), (2, signal.SIGTERM, False)],
    ids=["ctrl-c", "sigterm-2-workers"],
)
def test_the_demo_fleet_survives_a_group_sighup_and_stops_with_the_gateway(
    workers: int, stop: signal.Signals, to_group: bool
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_POLICY", "REDIS_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
        + ["--workers", str(workers), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a process group of its own, as a terminal's job has
    )
    url = f"http://127.0.0.1:{port}"
    fleet: set[int] = set()
    try:
        wait_http(url + "/ready", proc, timeout=60)
        fleet = fleet_pids(proc.pid)
        assert len(fleet) == 1
        assert ask(url)
        os.killpg(proc.pid, signal.SIGHUP)
        time.sleep(0.5)  # the signal's effects, if any, are immediate
        deadline = time.monotonic() + 10
        while True:  # the gateway reloads; the fleet serves on
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway did not come back after SIGHUP"
            time.sleep(0.05)
        assert proc.poll() is None and all(alive(p) for p in fleet)
        assert ask(url)
        if to_group:
            os.killpg(proc.pid, stop)
        else:
            os.kill(proc.pid, stop)
        proc.wait(30)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in fleet):
            assert time.monotonic() < deadline, "a child outlived the gateway"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for p in fleet:  # only the processes this test started
            if alive(p):
                os.kill(p, signal.SIGKILL)
