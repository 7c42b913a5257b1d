"""`gateway serve --workers 2`: a worker killed with SIGKILL is replaced by the parent, and the
replica keeps answering meanwhile (requests in flight on the killed worker are lost: README)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import free_port, wait_http

FLEET: list[Any] = [{"name": "a", "profile": "fast"}]


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (from /proc: no extra dependency)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def workers(pid: int) -> set[int]:
    """The uvicorn worker processes (the parent may also have helper children)."""
    found = set()
    for child in children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:  # not the resource tracker
            found.add(child)
    return found


def takes_sighup(pid: int) -> bool:
    """The process has a handler for SIGHUP and does not block it."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    bit = 1 << (signal.SIGHUP - 1)
    return bool(int(fields["SigCgt"], 16) & bit) and not int(fields["SigBlk"], 16) & bit


BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@contextlib.contextmanager
def two_workers(
    fleet: Fleet, tmp_path: Path, *, hup_at_birth: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], str, set[int]]]:
    """`gateway serve --workers 2` on a free port: (the parent, its URL, its two workers)."""
    if sys.platform != "linux":
        pytest.skip("reads /proc")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"providers:\n  a: {{base_url: '{fleet.url('a')}'}}\n"
        "pools:\n  main: {members: [a]}\nmodels:\n  chat: {pool: main}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
        + ["--policy", str(policy), "--workers", "2", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr.log").open("wb"),
        env={**os.environ, "GATEWAY_ACCESS_LOG": "0"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if hup_at_birth:  # while the workers are still importing the app
            deadline = time.monotonic() + 20
            while len(workers(proc.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.002)
            os.kill(proc.pid, signal.SIGHUP)
        wait_http(url + "/health", proc)
        deadline = time.monotonic() + 20
        while len(workers(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = workers(proc.pid)
        assert len(before) == 2, before
        yield proc, url, before
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_killed_worker_is_replaced_and_the_replica_keeps_answering(
    fleet: Fleet, tmp_path: Path
) -> None:
    with two_workers(fleet, tmp_path) as (proc, url, before):
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        while victim in children(proc.pid):  # gone (or a zombie): it accepts nothing any more
            time.sleep(0.005)
        answered = failed = 0
        replaced_after = None
        while time.monotonic() - killed_at < 30:
            try:
                r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=2)
                answered += r.status_code == 200
                failed += r.status_code != 200
            except httpx.HTTPError:
                failed += 1
            now = workers(proc.pid)
            if replaced_after is None and len(now) == 2 and victim not in now:
                replaced_after = time.monotonic() - killed_at
            if replaced_after is not None and answered >= 20:
                break
        assert replaced_after is not None, "the killed worker was not replaced"
        # How fast is the import time of a worker on the machine (seconds on a loaded 2-core
        # one): a bound, not a benchmark.
        assert replaced_after < 20.0
        assert answered >= 20
        # New connections go to live workers: none of these requests was in flight on the
        # killed worker, so none may fail.
        assert failed == 0


def test_sighup_reloads_the_workers_instead_of_restarting_them(
    fleet: Fleet, tmp_path: Path
) -> None:
    """SIGHUP to the parent is passed on to each worker (its policy reload); uvicorn's supervisor
    had restarted every worker, losing their state and the connections they held."""
    with two_workers(fleet, tmp_path) as (proc, url, before):
        os.kill(proc.pid, signal.SIGHUP)
        time.sleep(2.0)
        assert workers(proc.pid) == before
        for _ in range(6):
            r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10)
            assert r.status_code == 200


def test_sighup_while_workers_start_does_not_kill_them(fleet: Fleet, tmp_path: Path) -> None:
    """A worker still importing had no handler yet: the SIGHUP passed on killed it (the default
    action). Workers are born with SIGHUP blocked and take it once their handler is in place."""
    with two_workers(fleet, tmp_path, hup_at_birth=True) as (proc, url, before):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(takes_sighup(pid) for pid in before):
                break
            time.sleep(0.05)
        assert workers(proc.pid) == before
        # The SIGHUP held while each worker started was delivered then: one reload each.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            log = (tmp_path / "stderr.log").read_text(errors="replace")
            if log.count("applied (version") >= 2:
                break
            time.sleep(0.05)
        assert log.count("applied (version") == 2, log[-2000:]
        for _ in range(6):
            r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10)
            assert r.status_code == 200
