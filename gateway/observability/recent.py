"""The last minute of traffic, for the dashboard: rates, percentiles, recent decisions and errors.

A record-step observer with fixed-size rings (no growth, a few assignments per request); all
aggregation happens when the dashboard asks (`summary`), not per request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.context import Context

WINDOW_S = 60
_FIELDS = ("requests", "errors", "cache_hits", "degraded", "shed")


class _Second:
    __slots__ = ("cache_hits", "degraded", "errors", "requests", "shed", "stamp")

    def __init__(self) -> None:
        self.stamp = -1
        self.requests = self.errors = self.cache_hits = self.degraded = self.shed = 0


class RecentRequests:
    """Per-second counters over `WINDOW_S`, the latest latencies, decisions and failures."""

    def __init__(
        self,
        samples: int = 8192,
        decisions: int = 50,
        errors_per_member: int = 10,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._seconds = [_Second() for _ in range(WINDOW_S)]
        self._lat_t = [0.0] * samples
        self._lat_v = [0.0] * samples
        self._ttft_v: list[float | None] = [None] * samples
        self._i = 0
        self.decisions: deque[tuple[Any, ...]] = deque(maxlen=decisions)
        self.member_errors: dict[str, deque[tuple[float, str]]] = {}
        self._errors_per_member = errors_per_member
        self.total = 0

    def __call__(self, ctx: Context) -> None:
        now = self._clock()
        sec = int(now)
        slot = self._seconds[sec % WINDOW_S]
        if slot.stamp != sec:
            slot.__init__()  # type: ignore[misc]
            slot.stamp = sec
        slot.requests += 1
        status = ctx.status
        if status >= 500:
            slot.errors += 1
        elif status == 429:
            slot.shed += 1
        if ctx.cache.startswith("hit"):
            slot.cache_hits += 1
        if ctx.degraded:
            slot.degraded += 1
        total = ctx.end - ctx.start
        i = self._i
        n = len(self._lat_t)
        self._lat_t[i % n], self._lat_v[i % n], self._ttft_v[i % n] = now, total, ctx.ttft_s
        self._i = i + 1
        self.total += 1
        self.decisions.append(
            (
                now,
                ctx.request_id,
                ctx.tenant,
                ctx.alias,
                ctx.request_class,
                ctx.pool,
                ctx.provider,
                ctx.attempts,
                ctx.cache,
                ctx.degraded,
                status,
                total,
                ctx.ttft_s,
                ctx.failures,
            )
        )
        if ctx.failures:
            self._failures(now, ctx.failures)

    def _failures(self, now: float, failures: list[str]) -> None:
        for f in failures:
            provider, _, kind = f.rpartition(":")
            ring = self.member_errors.get(provider)
            if ring is None:
                ring = self.member_errors[provider] = deque(maxlen=self._errors_per_member)
            ring.append((now, kind))

    def errors_of(self, provider: str) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {"age_s": round(now - t, 1), "kind": k} for t, k in self.member_errors.get(provider, ())
        ]

    def summary(self) -> dict[str, Any]:
        """Rates per second and latency percentiles over the last minute, recent decisions."""
        now = self._clock()
        cutoff = int(now) - WINDOW_S + 1
        counts = dict.fromkeys(_FIELDS, 0)
        series = [0] * WINDOW_S  # requests per second, oldest first
        for s in self._seconds:
            if s.stamp >= cutoff:
                for f in _FIELDS:
                    counts[f] += getattr(s, f)
                series[s.stamp - cutoff] = s.requests
        lat = sorted(
            v for t, v in zip(self._lat_t, self._lat_v, strict=True) if t >= now - WINDOW_S
        )
        ttft = sorted(
            v
            for t, v in zip(self._lat_t, self._ttft_v, strict=True)
            if v is not None and t >= now - WINDOW_S
        )
        n = counts["requests"]
        return {
            "window_s": WINDOW_S,
            "total_requests": self.total,
            "requests": n,
            "rate_per_s": n / WINDOW_S,
            "per_second": series,
            "errors": counts["errors"],
            "error_ratio": counts["errors"] / n if n else 0.0,
            "cache_hits": counts["cache_hits"],
            "cache_hit_ratio": counts["cache_hits"] / n if n else 0.0,
            "degraded": counts["degraded"],
            "shed": counts["shed"],
            "latency_ms": {"p50": _pct_ms(lat, 0.50), "p99": _pct_ms(lat, 0.99)},
            "ttft_ms": {"p50": _pct_ms(ttft, 0.50), "p99": _pct_ms(ttft, 0.99)},
            "recent": [_decision(d, now) for d in reversed(self.decisions)],
        }


def _pct_ms(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (values sorted), in ms."""
    if not values:
        return None
    k = min(len(values) - 1, max(0, int(q * len(values) + 0.5) - 1))
    return round(values[k] * 1000, 3)


def _decision(d: tuple[Any, ...], now: float) -> dict[str, Any]:
    (
        t,
        rid,
        tenant,
        alias,
        cls,
        pool,
        provider,
        attempts,
        cache,
        degraded,
        status,
        total,
        ttft,
        f,
    ) = d
    return {
        "age_s": round(now - t, 1),
        "request_id": rid,
        "tenant": tenant,
        "alias": alias,
        "class": cls,
        "pool": pool,
        "provider": provider,
        "attempts": attempts,
        "cache": cache,
        "degraded": degraded,
        "status": status,
        "total_ms": round(total * 1000, 3),
        "ttft_ms": None if ttft is None else round(ttft * 1000, 3),
        "failures": list(f),
    }
