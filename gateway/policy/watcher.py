"""Hot reload: watch the policy file, reload on SIGHUP or an admin call, signal reloads via Redis.

A new version is read and validated off the event loop; an invalid file is refused with every
field path in the log and the running policy stays. With Redis, the replica that loaded a new
version publishes a reload SIGNAL carrying the file's hash, never the policy itself: each replica
re-reads its own file (anyone able to write to Redis must not be able to configure the gateway).
A replica whose file differs from the signalled hash says so in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson

from gateway.infra.filewatch import FileWatch, file_signature
from gateway.infra.hub import Subscription
from gateway.infra.shared_state import SharedState
from gateway.policy.loader import (
    PolicyError,
    check_policy_file,
    policy_fingerprint,
    read_policy_text,
    text_hash,
)
from gateway.policy.schema import Policy

log = logging.getLogger("gateway.policy")
CHANNEL = "policy"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class PolicyReloader:
    """Owns reloading for one process. `apply` swaps the runtime's snapshot."""

    def __init__(
        self,
        path: str | None,
        apply: Callable[[Policy], str],
        state: SharedState,
        replica_id: str,
    ) -> None:
        self.path = Path(path) if path else None
        self._apply = apply
        self.state = state
        self.replica_id = replica_id
        self.reloads = 0
        self.failures = 0
        self.last_error: list[str] = []
        self.file_hash: str | None = None  # hash of the file text now applied
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._watch: FileWatch | None = None
        self._sub: Subscription | None = None
        self.ignored_signals = 0  # reload signals not of the replicas' shape
        self._last_differs_log = float("-inf")

    def _read(self) -> tuple[str, Policy]:
        """Read and validate the file (runs in a worker thread: YAML and validation are CPU)."""
        if self.path is None:
            raise PolicyError("<none>", ["<file>: this gateway runs without a policy file"])
        text = read_policy_text(self.path)
        # The same full check as `gateway policy check` and start-up: rules files included.
        report = check_policy_file(self.path, text=text)
        if report.policy is None:
            raise PolicyError(str(self.path), report.errors)
        for w in report.warnings:
            log.warning("policy %s: %s", self.path, w)
        return text, report.policy

    async def reload(self, *, publish: bool = True, reason: str = "") -> str | None:
        """Load, validate and apply the file. Returns the new version, or None when refused (the
        running policy stays)."""
        async with self._lock:
            try:
                text, policy = await asyncio.to_thread(self._read)
                version = self._apply(policy)
            except Exception as e:  # noqa: BLE001 - any failure refuses the file, never the process
                self.failures += 1
                self.last_error = e.problems if isinstance(e, PolicyError) else [str(e)]
                log.error("policy reload refused, keeping the running policy: %s", e)
                return None
            self.file_hash = text_hash(text)
            self.reloads += 1
            self.last_error = []
        log.warning("policy %s applied (version %s)%s", self.path, version, reason)
        if publish and self.state.enabled:
            msg = orjson.dumps(
                {"origin": self.replica_id, "version": version, "sha256": self.file_hash}
            )
            await self.state.call(lambda r: r.publish(self.state.key(CHANNEL), msg), 0)
        return version

    def reload_soon(self) -> None:
        """For signal handlers: reload in a task."""
        self._spawn(self.reload())

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.path is not None:
            with contextlib.suppress(OSError, UnicodeDecodeError, PolicyError):
                self.file_hash = text_hash(read_policy_text(self.path))
            # Watch the folder: editors replace files rather than write in place, and a
            # Kubernetes ConfigMap volume swaps its `..data` symlink to a new timestamped folder,
            # so the event names `..data`, never the policy file (whose own symlink does not
            # change). Any event in the folder reloads when what the path resolves to changed.
            path = self.path
            self._watch = FileWatch(
                os.path.dirname(os.path.abspath(path)),
                self.reload,
                signature=lambda: file_signature(path),
                recursive=False,
                name="policy-watch",
            )
            self._watch.start()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.reload_soon)
                # `serve --workers` starts workers with SIGHUP blocked so that one still
                # importing is not killed by it; a SIGHUP held meanwhile arrives now.
                if hasattr(signal, "pthread_sigmask"):
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        if self.state.enabled:
            # Follow reload signals of other replicas; the hub resubscribes after an outage.
            self._sub = self.state.hub.subscribe(
                self.state.key(CHANNEL), self.on_signal, on_lost=self.state.mark_down
            )

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None
        if self._sub is not None:
            await self._sub.close()
            self._sub = None
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def on_signal(self, data: object) -> None:
        """Another replica reloaded: re-read our own file. Nothing in the message is applied.

        Only a message of the shape replicas publish counts (an origin of at most 200 printable
        characters, a SHA-256 in hex); anything else is dropped unread. The warning about a
        file that differs is logged at most every 10 s (a flood of signals must not flood the
        log)."""
        if self.path is None or not isinstance(data, (bytes, str)) or len(data) > 4096:
            return
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(msg, dict):
            return
        origin, announced = msg.get("origin"), msg.get("sha256")
        if not (
            isinstance(origin, str)
            and 0 < len(origin) <= 200
            and origin.isprintable()
            and isinstance(announced, str)
            and SHA256_HEX.fullmatch(announced)
        ):
            self.ignored_signals += 1
            return
        if origin == self.replica_id:
            return
        try:
            own = text_hash(await asyncio.to_thread(read_policy_text, self.path))
        except PolicyError as e:
            log.error("reload signal: cannot read %s: %s", self.path, e)
            return
        if own != announced:
            now = time.monotonic()
            if now - self._last_differs_log >= 10.0:
                self._last_differs_log = now
                log.warning(
                    "reload signal from %s names a policy file this replica does not have "
                    "(sha256 %s..., ours %s...); reloading our own file",
                    origin,
                    announced[:12],
                    own[:12],
                )
        if own != self.file_hash:
            await self.reload(publish=False, reason=" after a reload signal")


def replica_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


__all__ = ["PolicyReloader", "policy_fingerprint", "replica_id"]
