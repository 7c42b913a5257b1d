"""The one file watcher: configuration files reloaded when they change on disk.

`FileWatch(folder, on_change, ...)` watches a folder (not a file): editors replace files rather
than write in place, and a Kubernetes ConfigMap volume swaps its `..data` symlink to a new
timestamped folder, so the events name `..data` or a temporary file, never the watched file
(whose own symlink does not change). Events are debounced; with a `signature` (what the watched
path resolves to now), `on_change` runs only when it differs from the last one seen, and the
signature is also compared every second without events (a folder deleted and made again, or a
symlinked parent pointed elsewhere, sends no event the watch can see); without one, on every
batch of events. `on_change` decides what a bad file means (the users keep their
running configuration); an exception it raises is logged and the watch goes on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Hashable
from pathlib import Path
from typing import Any

from gateway.infra.tasks import stop_task

log = logging.getLogger("gateway.filewatch")


def file_signature(path: str | Path) -> tuple[str, int, int, int] | None:
    """What `path` resolves to now: real path, inode, size and modification time."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return real, st.st_ino, st.st_size, st.st_mtime_ns


class FileWatch:
    """One watched folder and the task that follows it; `start()` and `stop()`."""

    def __init__(
        self,
        folder: str | Path,
        on_change: Callable[[], Awaitable[Any]],
        *,
        signature: Callable[[], Hashable] | None = None,
        debounce_ms: int = 200,
        recursive: bool = True,
        force_polling: bool | None = None,
        catch_up: Callable[[], Any] | None = None,
        catch_up_s: float = 0.25,
        name: str = "file-watch",
    ) -> None:
        """`catch_up` runs once, `catch_up_s` after the start: for changes made between a
        user's first load and the watcher being ready."""
        self.folder = Path(folder)
        self._on_change = on_change
        self._signature = signature
        self._debounce_ms = debounce_ms
        self._recursive = recursive
        self._polling = force_polling
        self._catch_up = catch_up
        self._catch_up_s = catch_up_s
        self._name = name
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.changes = 0

    def start(self) -> None:
        self._stop.clear()
        seen = self._signature() if self._signature is not None else None
        self._task = asyncio.get_running_loop().create_task(self._watch(seen), name=self._name)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _watch(self, seen: Hashable) -> None:
        from watchfiles import awatch

        catch_up = (
            asyncio.get_running_loop().call_later(self._catch_up_s, self._catch_up)
            if self._catch_up is not None
            else None
        )
        try:
            async for changes in awatch(
                self.folder,
                stop_event=self._stop,
                debounce=self._debounce_ms,
                step=50,
                rust_timeout=1000,
                # Every second without events too: with a signature, the path is compared then.
                # Events stop for good when the folder itself is replaced (deleted and made
                # again, or a symlinked parent pointed elsewhere): the watch stays on the old one.
                yield_on_timeout=self._signature is not None,
                recursive=self._recursive,
                force_polling=self._polling,
            ):
                if not changes and self._signature is None:
                    continue
                if self._signature is not None:
                    now = self._signature()
                    if now == seen:
                        continue
                    seen = now
                self.changes += 1
                try:
                    await self._on_change()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - a failed reload never ends the watch
                    log.exception("reload after a change in %s failed", self.folder)
        finally:
            if catch_up is not None:
                catch_up.cancel()
