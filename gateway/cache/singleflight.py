"""Single-flight: identical concurrent cache misses share one upstream call.

The first request for a key becomes the leader; later identical requests wait on its future. A
success or a failure reaches every waiter. Waiters are bounded by a timeout, and if the leader goes
away (client disconnect) they proceed on their own instead of failing.
"""

from __future__ import annotations

import asyncio


class LeaderGone(Exception):
    """The leader stopped before producing an answer; waiters should fetch it themselves."""


class SingleFlight:
    def __init__(self) -> None:
        self._calls: dict[str, asyncio.Future[bytes]] = {}

    def join(self, key: str) -> asyncio.Future[bytes] | None:
        """None: the caller is the leader and must call `resolve` or `fail`. Else the future to await."""
        fut = self._calls.get(key)
        if fut is not None:
            return fut
        self._calls[key] = asyncio.get_running_loop().create_future()
        return None

    def resolve(self, key: str, value: bytes) -> None:
        fut = self._calls.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    def fail(self, key: str, exc: BaseException) -> None:
        fut = self._calls.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: having no waiters is normal

    def __len__(self) -> int:
        return len(self._calls)


async def wait(fut: asyncio.Future[bytes], timeout_s: float) -> bytes | None:
    """The leader's answer; None when the leader went away or took too long."""
    try:
        return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
    except (LeaderGone, TimeoutError):
        return None
