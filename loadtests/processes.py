"""`gateway serve` as a separate process, the way users run it, for instruments and tests.

Started through its command line (``python -m gateway.cli serve``), never imported: what is
measured is the installed gateway, not code shared with the instrument.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

#: Below the kernel's ephemeral range (32768-60999 on Linux), above Redis Cluster's 7000s and
#: their 17000s bus ports.
_PORTS = (20000, 32000)
_RNG = random.Random()  # its own, seeded per process: a test seeding `random` leaves it alone


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server started next.

    Not bind(0)'s: that port is ephemeral, and until the server binds it any outgoing
    connection of another test worker may take it as its local port (a gateway started with
    two workers then exited at once, uvicorn's "address in use"). A random port below the
    ephemeral range is taken only by another server that chose the same one.
    """
    for _ in range(100):
        port = _RNG.randint(*_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the range is full: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway_process(
    policy_path: Path,
    *,
    env: dict[str, str] | None = None,
    workers: int = 1,
    root: Path | None = None,
) -> Iterator[str]:
    """`gateway serve` as a separate process (what users run). Yields its base URL (…/v1).

    ``root``: run the gateway of another source tree (an old commit, for side-by-side runs).
    """
    with gateway_processes(policy_path, 1, env=env, workers=workers, root=root) as urls:
        yield urls[0]


@contextlib.contextmanager
def gateway_processes(
    policy_path: Path,
    count: int,
    *,
    env: dict[str, str] | None = None,
    workers: int = 1,
    root: Path | None = None,
) -> Iterator[list[str]]:
    """``count`` replicas of `gateway serve`, started together (each takes seconds to import).
    Yields their base URLs."""
    proc_env = {**os.environ, **(env or {})}
    if root is not None:
        proc_env["PYTHONPATH"] = str(root)
    started: list[tuple[subprocess.Popen[bytes], int]] = []
    try:
        for _ in range(count):
            port = free_port()
            command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            command += ["--policy", str(policy_path), "--workers", str(workers)]
            command += ["--log-level", "warning"]
            proc = subprocess.Popen(
                command, env=proc_env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            started.append((proc, port))
        for proc, port in started:
            wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield [f"http://127.0.0.1:{port}/v1" for _, port in started]
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise RuntimeError(f"process exited early:\n{out}")
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in {timeout}s")
