"""Hot reload: watch the policy file, reload on SIGHUP or an admin call, spread reloads via Redis.

A new version is validated first; an invalid file is refused with every field path in the log and
the running policy stays. With Redis, the replica that loaded a new version publishes its text so
that every other replica applies the same version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import orjson
from watchfiles import awatch

from gateway.policy.loader import PolicyError, parse_policy, policy_fingerprint
from gateway.policy.schema import Policy
from gateway.state import SharedState

log = logging.getLogger("gateway.policy")
CHANNEL = "policy"


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
        self._tasks: list[asyncio.Task[None]] = []

    def reload(
        self, *, text: str | None = None, source: str | None = None, publish: bool = True
    ) -> str | None:
        """Load, validate and apply. Returns the new version, or None when refused (old policy stays)."""
        src = source or str(self.path)
        try:
            if text is None:
                if self.path is None:
                    raise PolicyError("<none>", ["<file>: this gateway runs without a policy file"])
                text = self.path.read_text(encoding="utf-8")
            policy = parse_policy(text, src)
        except (PolicyError, OSError) as e:
            self.failures += 1
            self.last_error = e.problems if isinstance(e, PolicyError) else [str(e)]
            log.error("policy reload refused, keeping the running policy: %s", e)
            return None
        version = self._apply(policy)
        self.reloads += 1
        self.last_error = []
        log.warning("policy %s applied (version %s)", src, version)
        if publish and self.state.enabled:
            msg = orjson.dumps({"origin": self.replica_id, "version": version, "text": text})
            asyncio.get_running_loop().create_task(
                self.state.call(lambda r: r.publish(self.state.key(CHANNEL), msg), 0)
            )
        return version

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.path is not None:
            self._tasks.append(loop.create_task(self._watch()))
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.reload)
        if self.state.enabled:
            self._tasks.append(loop.create_task(self._subscribe()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _watch(self) -> None:
        assert self.path is not None
        folder = os.path.dirname(os.path.abspath(self.path))
        seen = file_signature(self.path)
        # Watch the folder: editors replace files rather than write in place, and a Kubernetes
        # ConfigMap volume swaps its `..data` symlink to a new timestamped folder, so the event
        # names `..data`, never the policy file (whose own symlink does not change). Any event
        # in the folder reloads when what the path resolves to changed.
        async for _changes in awatch(
            folder, debounce=200, step=50, rust_timeout=1000, recursive=False
        ):
            now = file_signature(self.path)
            if now != seen:
                seen = now
                self.reload()

    async def _subscribe(self) -> None:
        """Apply versions published by other replicas; reconnect with back-off while Redis is down."""
        channel = self.state.key(CHANNEL)
        delay = 0.5
        while True:
            redis = self.state.redis
            assert redis is not None
            try:
                async with redis.pubsub(ignore_subscribe_messages=True) as ps:
                    await ps.subscribe(channel)
                    delay = 0.5
                    async for msg in ps.listen():
                        self._on_message(msg.get("data"))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any Redis failure: retry later
                self.state.mark_down(e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _on_message(self, data: object) -> None:
        if not isinstance(data, (bytes, str)):
            return
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if msg.get("origin") == self.replica_id:
            return
        self.reload(text=msg.get("text", ""), source=f"replica {msg.get('origin')}", publish=False)


def file_signature(path: Path) -> tuple[str, int, int, int] | None:
    """What `path` resolves to now: real path, inode, size and modification time."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return real, st.st_ino, st.st_size, st.st_mtime_ns


def replica_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


__all__ = ["PolicyReloader", "policy_fingerprint", "replica_id"]
