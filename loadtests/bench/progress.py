"""A live progress bar (rich) that costs the request path only two integer increments."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .client import Sample


class LiveProgress:
    """One bar per phase; a background ticker redraws four times a second."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.done = 0
        self.errors = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not enabled,
        )

    def count(self, sample: Sample) -> None:
        self.done += 1
        if sample.error is not None:
            self.errors += 1

    @contextlib.asynccontextmanager
    async def phase(
        self, label: str, seconds: float | None, requests: int | None = None
    ) -> AsyncIterator[None]:
        """Show one phase, bounded by time (``seconds``) or by a request count."""
        if not self.enabled:
            yield
            return
        self.done = self.errors = 0
        total = seconds if seconds is not None else float(requests or 1)
        task = self._progress.add_task(label, total=total, stats="")
        start = time.perf_counter()

        async def tick() -> None:
            while True:
                elapsed = time.perf_counter() - start
                rate = self.done / elapsed if elapsed > 0 else 0.0
                stats = f"n={self.done} err={self.errors} {rate:,.0f} req/s"
                done = min(elapsed, total) if seconds is not None else float(self.done)
                self._progress.update(task, completed=done, stats=stats)
                await asyncio.sleep(0.25)

        ticker = asyncio.get_running_loop().create_task(tick())
        self._progress.start()
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            self._progress.update(task, completed=total)
            self._progress.stop()
