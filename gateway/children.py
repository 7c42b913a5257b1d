"""Upstreams that `gateway serve` starts itself: the simulated fleet of the built-in demo and the
local llama.cpp servers of `--real-local`.

Both live in the `loadtests` package (installed with the gateway) and run as child processes,
`python -m loadtests.simulator ...` or `python -m loadtests.llama ...`: the gateway never imports
the instruments that measure it. A child prints one line `PREFIX {json}` once it serves (the JSON
maps each instance's name to its base URL under "instances"); the gateway then checks that every
instance answers `/health`. A child runs apart (`setsid`: a process group of its own): a signal
sent to the gateway's process group (a terminal closed, `kill -HUP -PGID`, Ctrl-C) reaches the
gateway only, which reloads on SIGHUP; had it reached the child, the gateway would have gone on
serving over a dead fleet. The gateway stops it instead: when it exits (atexit, `serve`'s own clean-up), when it gets
SIGTERM or SIGINT (or SIGHUP before its reload handler is in place), and the child stops on its
own when its stdin closes (the gateway died, even by SIGKILL).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGE = "loadtests"
_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


class ChildError(RuntimeError):
    """The child could not start: its package is missing, it exited, or it did not answer."""


class Child:
    """A started child: its instances' base URLs (``…/v1``) and ``close()``."""

    def __init__(self, what: str, proc: subprocess.Popen[bytes], ready: dict[str, Any]) -> None:
        self.what = what
        self.proc = proc
        self.pid = proc.pid
        self.ready = ready
        self._urls: dict[str, str] = dict(ready.get("instances") or {})
        self._owner = os.getpid()  # a forked worker must not stop its parent's children
        self.leftovers: list[Path] = []
        """Folders written for this child (the demo's policy), removed when it is closed: also
        on SIGTERM, after which the process ends by the signal without running `serve`'s own
        clean-up."""

    @property
    def names(self) -> list[str]:
        return list(self._urls)

    def url(self, name: str) -> str:
        return self._urls[name]

    def urls(self) -> list[str]:
        return list(self._urls.values())

    def close(self) -> None:
        """Close its stdin (it exits on EOF), then SIGTERM and SIGKILL if it lingers; remove its
        `leftovers`."""
        if os.getpid() != self._owner:
            return
        while self.leftovers:
            shutil.rmtree(self.leftovers.pop(), ignore_errors=True)
        if self.proc.poll() is not None:
            return
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for step in (self.proc.terminate, self.proc.kill):
            try:
                self.proc.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                step()
        self.proc.wait()


def package_root(module: str) -> Path:
    """The folder holding the `loadtests` package, found without importing it; ChildError with
    what to do when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)  # a top-level lookup imports nothing
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    sub = module.split(".")[1:]
    for folder in folders:
        if Path(folder, *sub).is_dir() or Path(folder, *sub[:-1], sub[-1] + ".py").is_file():
            return Path(folder).parent
    raise ChildError(
        f"`{module}` is not installed: it ships in the `{PACKAGE}` package with the gateway. "
        "Install the whole package (`pip install -e .` from a source checkout), or give a "
        "policy file with --policy."
    )


def start_child(
    what: str, module: str, args: list[str], ready_prefix: str, timeout_s: float = 30.0
) -> Child:
    """Run `python -m module args...`, wait for its ready line and for every instance to answer
    `/health`; the child is stopped at exit and on SIGTERM/SIGINT/SIGHUP. Raises ChildError."""
    root = package_root(module)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        # Out of the gateway's process group: signals meant for the gateway are not its own.
        start_new_session=True,
    )
    try:
        ready = _wait_ready(proc, ready_prefix, timeout_s, what)
        child = Child(what, proc, ready)
        _wait_healthy(child, time.monotonic() + timeout_s)
    except BaseException:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        raise
    _track(child)
    return child


def _wait_ready(
    proc: subprocess.Popen[bytes], prefix: str, timeout_s: float, what: str
) -> dict[str, Any]:
    """The JSON of the child's ready line. Its stdout is read (and dropped) to the end, so that
    the child never blocks on a full pipe."""
    found: dict[str, Any] = {}
    event = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                if not event.is_set() and line.startswith(prefix):
                    with contextlib.suppress(ValueError):
                        found.update(json.loads(line[len(prefix) :]))
                    event.set()
        finally:
            event.set()

    threading.Thread(target=reader, name=f"{what}-stdout", daemon=True).start()
    event.wait(timeout_s)
    if found.get("instances"):
        return found
    code = proc.poll()
    if code is not None:
        raise ChildError(f"{what} exited with code {code} before it was ready (see above)")
    raise ChildError(f"{what} did not start within {timeout_s:.0f} s")


def _wait_healthy(child: Child, deadline: float) -> None:
    for url in child.urls():
        health = url.removesuffix("/v1") + "/health"
        while True:
            try:
                with urllib.request.urlopen(health, timeout=2) as r:  # noqa: S310 (loopback URL)
                    if r.status == 200:
                        break
            except OSError:
                pass
            if child.proc.poll() is not None:
                raise ChildError(f"{child.what} exited with code {child.proc.returncode}")
            if time.monotonic() > deadline:
                raise ChildError(f"{child.what}: {health} did not answer")
            time.sleep(0.05)


_children: list[Child] = []
_previous: dict[int, Any] = {}


def close_all() -> None:
    while _children:
        with contextlib.suppress(Exception):
            _children.pop().close()


def _on_signal(sig: int, frame: FrameType | None) -> None:
    """Stop the children, then do what the signal did before (exit, or KeyboardInterrupt)."""
    close_all()
    previous = _previous.get(sig)
    if previous is None:  # a handler not set from Python: treat as the default
        previous = signal.SIG_DFL
    if callable(previous):
        previous(sig, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)


def _track(child: Child) -> None:
    if not _children and not _previous:
        atexit.register(close_all)
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                _previous[sig] = signal.signal(sig, _on_signal)
    _children.append(child)
