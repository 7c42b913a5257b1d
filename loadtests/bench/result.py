"""What a benchmark run produces, independent of how it is written out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .client import Client, Sample, Target
from .progress import LiveProgress
from .prompts import RequestFactory

Row = dict[str, Any]  # one table row: JSON-ready values


@dataclass(slots=True)
class Result:
    """Tables (title → rows) are the report; notes are the headline findings."""

    mode: str
    config: dict[str, Any]
    tables: dict[str, list[Row]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    t0: float = 0.0


@dataclass(slots=True)
class Bench:
    """Everything a mode needs to send requests: the client, targets, request shapes, progress."""

    client: Client
    targets: list[Target]
    factory: RequestFactory
    progress: LiveProgress
    max_requests: int = 1_000_000  # per phase, so every run is bounded in count too
    drain_s: float = 60.0

    @property
    def stream(self) -> bool:
        return self.factory.stream

    def sender(self, target: Target, tag: str) -> Callable[[], Awaitable[Sample]]:
        """A zero-argument closed-loop request function bound to ``target`` and ``tag``."""
        return lambda: self.send(target, tag)

    async def send(self, target: Target, tag: str, scheduled: float | None = None) -> Sample:
        body = self.factory.next(target.model)
        return await self.client.send(target, body, self.stream, scheduled, tag)
