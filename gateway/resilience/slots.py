"""A member's `max_inflight` shared by the worker processes of one `gateway serve --workers N`.

Per-process shares (gateway.infra.shares) divide a limit into whole slots per process: a limit
smaller than the number of workers left some workers with none, and those refused every request
for that member (a 429 for one request in two with `max_inflight: 1` and two workers, the one slot
idle in the other worker). The workers of one replica therefore share a small limit through lock
files instead: slot i of a member is an exclusive `flock` on its own file in a folder private to
the replica (`GATEWAY_SLOTS_DIR`, made by `serve`); a request holds one while in flight. The
kernel drops a process's locks when it dies, so a crashed worker never keeps a slot.

What the replica's workers share is the replica's part of the deployment's limit: all of it for
one replica; with Redis and several replicas, `floor(total / replicas)`, where replicas =
processes / workers (rounded up). A limit above MAX_SHARED_SLOTS keeps per-process shares (each
worker's share is then large, and a full member would cost a lock attempt per slot per check).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.infra.shares import Shares
    from gateway.routing.member import Member

SLOTS_DIR_ENV = "GATEWAY_SLOTS_DIR"
#: Limits up to this many slots are shared through lock files; larger ones are divided.
MAX_SHARED_SLOTS = 64


class SlotFiles:
    """`capacity` slots of one member, each an exclusive lock on a file; non-blocking."""

    def __init__(self, folder: Path, key: str, capacity: int) -> None:
        # The member's name is configuration: hashed, it is never a path.
        digest = hashlib.blake2b(key.encode(), digest_size=12).hexdigest()
        self._prefix = str(folder / f"member-{digest}")
        self._fds: dict[int, int] = {}
        # Slots this process holds: a lock asked again on its own file would be granted.
        self._mine: set[int] = set()
        self._next = os.getpid()  # workers start their scans at different slots
        self.capacity = capacity

    def _fd(self, index: int) -> int:
        fd = self._fds.get(index)
        if fd is None:
            flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
            fd = os.open(f"{self._prefix}.{index}", flags, 0o600)
            self._fds[index] = fd
        return fd

    def try_acquire(self) -> int | None:
        """A free slot's index, now held by this process; None when all are taken."""
        n = self.capacity
        for k in range(n):
            index = (self._next + k) % n
            if index in self._mine:
                continue
            try:
                fcntl.flock(self._fd(index), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # taken (BlockingIOError), or its file cannot be opened: not free
            self._next = index + 1
            self._mine.add(index)
            return index
        return None

    def release(self, index: int) -> None:
        self._mine.discard(index)
        fd = self._fds.get(index)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)

    def __del__(self) -> None:
        # A member removed by a reload: its files' descriptors (and any lock left) go with it.
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # releases its lock too
        self._fds.clear()
        self._mine.clear()


def slots_folder() -> Path | None:
    """The replica's slot folder when this process is one of several workers, else None."""
    folder = os.environ.get(SLOTS_DIR_ENV)
    if not folder or _workers() <= 1 or not os.path.isdir(folder):
        return None
    return Path(folder)


def _workers() -> int:
    try:
        return max(1, int(os.environ.get("GATEWAY_WORKERS", "1") or 1))
    except ValueError:
        return 1


def replica_limit(total: int, processes: int) -> int:
    """This replica's part of a deployment-wide `total` shared by `processes` processes."""
    replicas = max(1, math.ceil(max(1, processes) / _workers()))
    # Rounded down: under-use, never more than the total across replicas (as the shares).
    return total if replicas == 1 else total // replicas


def limit_member(member: Member, shares: Shares, total: int | None, name: str) -> None:
    """Set `member`'s limit in this process: the replica's slots shared with the other workers
    (a small limit, several workers), else this process's share (gateway.infra.shares)."""
    folder = slots_folder() if total is not None and total <= MAX_SHARED_SLOTS else None
    if folder is None or total is None:
        member.max_inflight = shares.limit(total, name)
        member.share_slots(None)
        return
    capacity = replica_limit(total, shares.count)
    member.max_inflight = capacity
    if member.slots is not None and member.slots.capacity != capacity:
        # Slots held beyond a smaller capacity are released when their requests end.
        member.slots.capacity = capacity
    elif member.slots is None:
        member.share_slots(SlotFiles(folder, name, capacity))
