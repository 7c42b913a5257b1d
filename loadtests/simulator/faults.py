"""Faults an instance can be told to inject at run time, and the per-request decision.

Faults are switched through ``POST /admin/faults`` on the instance port, through the fleet admin
port (``POST /instances/{name}/faults``, which also works while the instance refuses connections),
or through the Python fleet handle. Setting faults replaces the whole set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Faults(BaseModel):
    """Run-time faults; the defaults mean a healthy instance."""

    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of requests answered with an error"
    )
    error_status: list[int] = Field(default_factory=lambda: [500], min_length=1)
    rate_limit: float = Field(default=0.0, ge=0, le=1, description="share of requests answered 429")
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After header value on 429")
    slow_first_token_ms: float = Field(
        default=0.0, ge=0, description="extra delay before the first token"
    )
    ttft_multiplier: float = Field(default=1.0, gt=0, description="scales base + prefill time")
    hang: bool = Field(default=False, description="never answer; wait until the client gives up")
    refuse_connections: bool = Field(
        default=False, description="stop listening: connection refused"
    )
    cut_stream_after_chunks: int | None = Field(
        default=None,
        ge=0,
        description="close the connection after N content chunks, without [DONE]",
    )
    slow_decode: float = Field(default=1.0, ge=1, description="decode this many times slower")
    unhealthy: bool = Field(default=False, description="GET /health answers 503")
    # Broken answers: what a hostile or misconfigured upstream sends with a 200.
    broken_body: Literal["garbage_json", "html", "truncated_json"] | None = Field(
        default=None,
        description="answer 200 with invalid JSON, an HTML page, or the real JSON cut in half "
        "(complete HTTP framing); a streamed request gets the same non-SSE body, except "
        "truncated_json, which sends a role chunk then a cut event and ends cleanly",
    )
    broken_rate: float = Field(
        default=1.0, ge=0, le=1, description="share of requests that get the broken body"
    )
    end_stream_after_chunks: int | None = Field(
        default=None,
        ge=0,
        description="end a stream cleanly (complete chunked framing) after N content chunks, "
        "without a finish chunk or [DONE]",
    )
    stall_after_chunks: int | None = Field(
        default=None,
        ge=0,
        description="stop sending after N content chunks and keep the connection open; a "
        "non-streamed answer sends its headers, then nothing",
    )
    trickle_bytes_per_s: float | None = Field(
        default=None, gt=0, description="write every response this slowly, a few bytes at a time"
    )
    spike_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of requests delayed by spike_ms"
    )
    spike_ms: float = Field(default=0.0, ge=0, description="extra delay of a latency spike")

    @field_validator("error_status")
    @classmethod
    def _statuses(cls, v: list[int]) -> list[int]:
        if any(not 400 <= s <= 599 for s in v):
            raise ValueError("error_status entries must be HTTP error codes (400-599)")
        return v

    @property
    def active(self) -> bool:
        """True when any fault would change how a request is served."""
        return self != HEALTHY


HEALTHY = Faults()


class Verdict(Enum):
    """What the fault injector decided for one inference request, before any work."""

    SERVE = 0
    ERROR = 1
    RATE_LIMIT = 2
    HANG = 3


@dataclass(frozen=True, slots=True)
class Shape:
    """How one served request is altered: a broken body, a latency spike (seconds)."""

    broken: str | None = None
    spike_s: float = 0.0


PLAIN = Shape()


class FaultInjector:
    """Holds the current faults and draws per-request decisions from a seeded RNG."""

    def __init__(self, seed: int = 0, initial: Faults | None = None) -> None:
        self.faults = HEALTHY
        self.set(initial or HEALTHY)
        self._rng = random.Random(seed)
        self.injected: dict[str, int] = {}

    def set(self, faults: Faults) -> None:
        # Keep the HEALTHY singleton so the hot path can test identity, not equality.
        self.faults = HEALTHY if faults == HEALTHY else faults

    def count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1

    def decide(self) -> tuple[Verdict, int]:
        """Verdict for a new request plus the error status to use (0 when serving)."""
        f = self.faults
        if f is HEALTHY:
            return Verdict.SERVE, 0
        if f.hang:
            self.count("hang")
            return Verdict.HANG, 0
        if f.rate_limit and (f.rate_limit >= 1 or self._rng.random() < f.rate_limit):
            self.count("rate_limit")
            return Verdict.RATE_LIMIT, 429
        if f.error_rate and (f.error_rate >= 1 or self._rng.random() < f.error_rate):
            self.count("error")
            return Verdict.ERROR, self._rng.choice(f.error_status)
        return Verdict.SERVE, 0

    def shape(self) -> Shape:
        """Per-request alterations of a request that is served."""
        f = self.faults
        if f is HEALTHY:
            return PLAIN
        broken = None
        if f.broken_body and (f.broken_rate >= 1 or self._rng.random() < f.broken_rate):
            broken = f.broken_body
            self.count(f"broken_{broken}")
        spike = 0.0
        if f.spike_rate and (f.spike_rate >= 1 or self._rng.random() < f.spike_rate):
            spike = f.spike_ms / 1000.0
            self.count("spike")
        return PLAIN if broken is None and not spike else Shape(broken, spike)
