"""`gateway serve` with no policy: the built-in demo over a simulated fleet in a child process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway import children
from gateway.children import ChildError
from tests.support import free_port, wait_http


def _children_of(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":  # fields: state, ppid, ...
            out.append(int(stat.parent.name))
    return out


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_answers_and_stops_its_simulator(sig: signal.Signals) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_POLICY"}
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=60)
        sims = _children_of(proc.pid)
        assert len(sims) == 1, sims
        cmdline = Path(f"/proc/{sims[0]}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:4] == [b"-m", b"loadtests.simulator", b"fleet"]
        base = f"http://127.0.0.1:{port}/v1"
        models = httpx.get(f"{base}/models", timeout=10).json()["data"]
        assert models and all("simulated" in m["owned_by"] for m in models)
        body = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
        r = httpx.post(f"{base}/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert r.headers["x-gateway-provider"].startswith("sim-")
    finally:
        proc.send_signal(sig)
        out = proc.communicate(timeout=30)[0].decode()
    assert _gone(sims[0]), f"the simulator outlived the gateway:\n{out}"
    # The demo's policy file was written into a folder of its own: gone with the gateway.
    written = re.search(r"SIMULATED providers \((.+?)\)", out)
    assert written, out
    assert not Path(written[1]).parent.exists(), f"{written[1]} left behind"
    assert "Fatal Python error" not in out and "Traceback" not in out, out


def test_missing_simulator_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(children.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ChildError, match=r"`loadtests.simulator` is not installed.*--policy"):
        children.start_child("the simulated fleet", "loadtests.simulator", [], "SIM-READY ")
