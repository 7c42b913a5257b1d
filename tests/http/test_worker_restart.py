"""`gateway serve --workers 2`: a worker killed with SIGKILL is replaced by the parent, and the
replica keeps answering meanwhile (requests in flight on the killed worker are lost: README)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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


class Replica:
    """`gateway serve --workers 2` on a free port, sent a SIGHUP while its workers were still
    importing the app. One for the module: its tests follow one life (born, reloaded, a worker
    killed), each reading the state it starts from."""

    def __init__(self, fleet: Fleet, folder: Path) -> None:
        policy = folder / "policy.yaml"
        policy.write_text(
            f"providers:\n  a: {{base_url: '{fleet.url('a')}'}}\n"
            "pools:\n  main: {members: [a]}\nmodels:\n  chat: {pool: main}\n"
        )
        self.log = folder / "stderr.log"
        port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            + ["--policy", str(policy), "--workers", "2", "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
            env={**os.environ, "GATEWAY_ACCESS_LOG": "0"},
        )
        self.url = f"http://127.0.0.1:{port}"

    def workers(self) -> set[int]:
        return workers(self.proc.pid)

    def reloads(self) -> int:
        return self.log.read_text(errors="replace").count("applied (version")

    def answers(self, n: int = 6) -> None:
        for _ in range(n):
            r = httpx.post(self.url + "/v1/chat/completions", json=BODY, timeout=10)
            assert r.status_code == 200

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def replica(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    if sys.platform != "linux":
        pytest.skip("reads /proc")
    r = Replica(fleet, tmp_path_factory.mktemp("replica"))
    try:
        deadline = time.monotonic() + 20
        while len(r.workers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(r.proc.pid, signal.SIGHUP)  # while the workers are still importing the app
        wait_http(r.url + "/health", r.proc)
        yield r
    finally:
        r.stop()


def wait_until(condition: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sighup_while_workers_start_does_not_kill_them(replica: Replica) -> None:
    """A worker still importing had no handler yet: the SIGHUP passed on killed it (the default
    action). Workers are born with SIGHUP blocked and take it once their handler is in place."""
    assert wait_until(lambda: len(replica.workers()) == 2, 20)
    born = replica.workers()
    assert wait_until(lambda: all(takes_sighup(pid) for pid in born), 30)
    assert replica.workers() == born
    # The SIGHUP held while each worker started was delivered then: one reload each.
    assert wait_until(lambda: replica.reloads() >= 2, 10)
    assert replica.reloads() == 2
    replica.answers()


def test_sighup_reloads_the_workers_instead_of_restarting_them(replica: Replica) -> None:
    """SIGHUP to the parent is passed on to each worker (its policy reload); uvicorn's supervisor
    had restarted every worker, losing their state and the connections they held."""
    before, reloads = replica.workers(), replica.reloads()
    os.kill(replica.proc.pid, signal.SIGHUP)
    assert wait_until(lambda: replica.reloads() == reloads + 2, 10)
    assert replica.workers() == before
    replica.answers()


def test_killed_worker_is_replaced_and_the_replica_keeps_answering(replica: Replica) -> None:
    proc, url, before = replica.proc, replica.url, replica.workers()
    assert len(before) == 2
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
    # The time a worker takes to import on the machine (seconds on a loaded 2-core one): a
    # bound, not a benchmark.
    assert replaced_after < 20.0
    assert answered >= 20
    # New connections go to live workers: none of these requests was in flight on the killed
    # worker, so none may fail.
    assert failed == 0
