"""Operator drains of members, the same in every worker and replica.

`POST /admin/members/{name}/drain` reaches one process: a drain kept there alone left the other
workers of `serve --workers N`, and the other replicas, sending to the member. The drained set is
kept where all of them read it:

- with shared state (Redis): a hash of member names; a change publishes a bare "changed" on a
  channel and every process re-reads the hash (also after each resubscription and every
  `REREAD_S`, for messages lost while Redis was away). The message carries nothing to apply;
- else, with several workers: a small file in the workers' folder (`GATEWAY_SLOTS_DIR`, made by
  `serve`), re-read when it changes (checked every `POLL_S`);
- else (one process): this process only.

Only the names of the running policy's members are read back (`HMGET` of those names, and at
most `MAX_FILE_BYTES` of the file): what sits in Redis or the file can take a member out of
rotation, never configure anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Any, Protocol

import orjson

from gateway.infra.hub import Subscription
from gateway.infra.shared_state import SharedState
from gateway.infra.tasks import stop_task

log = logging.getLogger(__name__)

FOLDER_ENV = "GATEWAY_SLOTS_DIR"
FILE_NAME = "drained.json"
MAX_FILE_BYTES = 64 * 1024
POLL_S = 0.5
REREAD_S = 5.0


class DrainTarget(Protocol):
    """What the drains act on (gateway.runtime.Runtime)."""

    drained: frozenset[str]

    def member_names(self) -> list[str]: ...
    def set_drained(self, names: frozenset[str]) -> None: ...


class SharedDrains:
    def __init__(
        self, target: DrainTarget, state: SharedState | None, folder: str | None = None
    ) -> None:
        self.target = target
        self.state = state if state is not None and state.enabled else None
        if folder is None:
            folder = os.environ.get(FOLDER_ENV) or None
        self.file = Path(folder) / FILE_NAME if folder and self.state is None else None
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._file_sig: tuple[int, int] | None = None

    @property
    def scope(self) -> str:
        """Where a drain reaches: "replicas", "workers" or "process"."""
        return "replicas" if self.state else "workers" if self.file else "process"

    async def change(self, name: str, drained: bool) -> None:
        """Drain (or undrain) `name` here at once, then wherever the set is shared."""
        names = self.target.drained | {name} if drained else self.target.drained - {name}
        self.target.set_drained(names)
        if self.state is not None:
            key, channel = self.state.key("drained"), self.state.key("drains")

            async def write(r: Any) -> None:
                await (r.hset(key, name, "1") if drained else r.hdel(key, name))
                await r.publish(channel, b"changed")

            await self.state.call(write, None)
        elif self.file is not None:
            await asyncio.to_thread(self._update_file, name, drained)

    # -- following the others ------------------------------------------------------------------
    async def start(self) -> None:
        if self.state is not None:
            self._sub = self.state.hub.subscribe(
                self.state.key("drains"), self._changed, on_subscribed=self._changed_now
            )
        if self.state is not None or self.file is not None:
            await self.refresh()
            self._task = asyncio.create_task(self._follow(), name="drains")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        if self._sub is not None:
            await self._sub.close()
            self._sub = None

    def _changed(self, raw: bytes) -> None:
        self._wake.set()  # whatever the message says: only a reason to re-read

    async def _changed_now(self) -> None:
        self._wake.set()

    async def _follow(self) -> None:
        every = REREAD_S if self.state is not None else POLL_S
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), every)
            self._wake.clear()
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - a bad read keeps the set as it was
                log.exception("reading the drained members failed")
            await asyncio.sleep(0.05)  # a burst of messages is one re-read

    async def refresh(self) -> None:
        """Read the shared set back (only the policy's members) and apply it."""
        names = self.target.member_names()
        if self.state is not None:
            key = self.state.key("drained")

            async def read(r: Any) -> list[Any] | None:
                return list(await r.hmget(key, names)) if names else []

            values = await self.state.call(read, None)
            if values is None:  # Redis away: keep what we have
                return
            found = {n for n, v in zip(names, values, strict=True) if v is not None}
        elif self.file is not None:
            read_back = await asyncio.to_thread(self._read_file)
            if read_back is None:
                return
            found = read_back & set(names)
        else:
            return
        # Names outside the policy are kept as they are here (a reload may bring them back).
        kept = {n for n in self.target.drained if n not in names}
        if found | kept != set(self.target.drained):
            self.target.set_drained(frozenset(found | kept))

    def _update_file(self, name: str, drained: bool) -> None:
        """Read, change and write the file under a lock: another worker's drain made a moment
        ago (not yet read here) is kept."""
        assert self.file is not None
        with open(self.file.with_name(f".{FILE_NAME}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._file_sig = None
            names: set[str] = self._read_file() or set()
            if drained:
                names.add(name)
            else:
                names.discard(name)
            tmp = self.file.with_name(f".{FILE_NAME}.{os.getpid()}")
            tmp.write_bytes(orjson.dumps(sorted(names)))
            os.replace(tmp, self.file)  # atomic: a reader sees the old file or the new one

    def _read_file(self) -> set[str] | None:
        """The names in the file when it changed since last read; None when unchanged or
        unreadable (an empty set when it does not exist)."""
        assert self.file is not None
        try:
            st = self.file.stat()
        except FileNotFoundError:
            if self._file_sig is None:
                return None
            self._file_sig = None
            return set()
        except OSError:
            return None
        sig = (st.st_mtime_ns, st.st_size)
        if sig == self._file_sig:
            return None
        if st.st_size > MAX_FILE_BYTES:
            return None
        try:
            doc = orjson.loads(self.file.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        self._file_sig = sig
        if not isinstance(doc, list):
            return set()
        return {n for n in doc if isinstance(n, str)}
