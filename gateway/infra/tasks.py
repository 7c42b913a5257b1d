"""Stopping a background task: cancelled, and cancelled again while it runs on.

A library may swallow a cancellation: redis-py's blocking read racing its own timeout turns it
into that timeout (the read returns nothing), and Python 3.11's `asyncio.wait_for` can lose one
that races its timeout. A loop that then went on held its stop() (and the process's shutdown, a
test's teardown) forever. Here a task that has not ended `GRACE_S` after its cancellation (time
for its own clean-up) is cancelled again every `RECANCEL_S`, and given up on, logged, after
`LIMIT_S`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("gateway")

GRACE_S = 2.0
RECANCEL_S = 0.1
LIMIT_S = 10.0


async def stop_task(task: asyncio.Task[Any] | None) -> bool:
    """Cancel `task` and wait until it ends: True; False when it still runs after `LIMIT_S`
    (left running). An exception it ended with is logged, not raised."""
    if task is None:
        return True
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        task.cancel()
        await asyncio.wait({task}, timeout=GRACE_S)
        while not task.done():
            if loop.time() - start >= LIMIT_S:
                log.warning(
                    "task %s did not stop in %.0f s: left running", task.get_name(), LIMIT_S
                )
                return False
            task.cancel()  # the last one was swallowed
            await asyncio.wait({task}, timeout=RECANCEL_S)
    except asyncio.CancelledError:
        task.cancel()  # the caller is cancelled itself: so is what it stopped
        raise
    if not task.cancelled() and task.exception() is not None:
        log.warning("task %s had ended with %r", task.get_name(), task.exception())
    return True
