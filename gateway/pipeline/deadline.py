"""The request's deadline: how long it may wait, in all, for its answer to start.

The policy's `retry.deadline_s` bounds it, and a model's own `models.<alias>.deadline_s` where
shorter; a client may shorten it (never lengthen it) with
`x-gateway-timeout`, in seconds. A value that is not a plain positive decimal number of at most
`MAX_HEADER_CHARS` characters is ignored, as `x-gateway-cache-ttl`'s are. The deadline counts
from the request's arrival, so time spent before the upstream attempts (limits, cache) is part
of it.

The official clients' `x-stainless-read-timeout` / `x-stainless-timeout` are not read: they are a
per-read timeout (a stream may run far longer), sent by default (600 s), and a client that gives
up on its own must be recorded as gone (499, charged as such), not answered a 504 it never reads.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping

from gateway.context import Context

GATEWAY_HEADER = "x-gateway-timeout"
MAX_HEADER_CHARS = 32
# Digits, an optional fraction: no sign, exponent, `nan`, `inf`, `_` or whitespace (which
# float() would take).
_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?")


def header_seconds(value: str | None) -> float | None:
    """A client's timeout header as positive finite seconds, or None for anything else."""
    if not value or len(value) > MAX_HEADER_CHARS or _SECONDS.fullmatch(value) is None:
        return None
    seconds = float(value)
    return seconds if seconds > 0 and math.isfinite(seconds) else None


class Deadline:
    """A point on the event loop's clock (time.monotonic) the request's answer must start by."""

    __slots__ = ("at", "limit_s", "source")

    def __init__(self, at: float, limit_s: float, source: str) -> None:
        self.at, self.limit_s, self.source = at, limit_s, source

    def left_s(self) -> float:
        return self.at - time.monotonic()


def request_deadline(
    policy_s: float | None,
    headers: Mapping[str, str],
    ctx: Context,
    model: tuple[str, float | None] = ("", None),
) -> Deadline | None:
    """The request's deadline: the shortest of the policy's, the model's (`model`: the alias's
    name and `deadline_s`) and the client's header; None if none gives one. Counted from the
    request's arrival (`ctx.start`, a perf_counter reading)."""
    limit_s, source = policy_s, "retry.deadline_s"
    alias, alias_s = model
    if alias_s is not None and (limit_s is None or alias_s < limit_s):
        limit_s, source = alias_s, f"models.{alias}.deadline_s"
    asked = header_seconds(headers.get(GATEWAY_HEADER))
    if asked is not None and (limit_s is None or asked < limit_s):
        limit_s, source = asked, GATEWAY_HEADER
    if limit_s is None:
        return None
    spent = max(0.0, time.perf_counter() - ctx.start)
    return Deadline(time.monotonic() - spent + limit_s, limit_s, source)
