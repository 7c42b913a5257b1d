"""Turn samples into table rows: one summary row per group, one timeline row per window.

Rows hold milliseconds (``*_ms``) and rates, ready for JSON, markdown and plots. Latency and TTFT
count from each request's scheduled time (see ``client.Sample``); ``service_*`` from the send.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .client import Sample
from .stats import percentiles, summarize, window_index

Row = dict[str, Any]  # one table row: JSON-ready values


def _ms(values: Sequence[float], prefix: str, qs: Sequence[float] = (50.0, 90.0, 99.0)) -> Row:
    ps = percentiles(values, qs)
    out: Row = {f"{prefix}_p{q:g}_ms": 1000 * p for q, p in zip(qs, ps, strict=True)}
    return out


def summary_row(samples: Sequence[Sample], wall_s: float) -> Row:
    """Counts, throughput, and latency / TTFT / lateness percentiles of successful requests."""
    ok = [s for s in samples if s.error is None]
    lat = summarize(s.latency for s in ok)
    ttft = [s.ttft for s in ok if not math.isnan(s.first)]
    out_tokens = sum(s.out_tokens for s in ok)
    row: Row = {
        "requests": len(samples),
        "ok": len(ok),
        "errors": len(samples) - len(ok),
        "wall_s": wall_s,
        "req_per_s": len(ok) / wall_s if wall_s > 0 else math.nan,
        "out_tok_per_s": out_tokens / wall_s if wall_s > 0 else math.nan,
        "lat_mean_ms": 1000 * lat.mean,
        "lat_std_ms": 1000 * lat.std,
        "lat_p50_ms": 1000 * lat.p50,
        "lat_p90_ms": 1000 * lat.p90,
        "lat_p99_ms": 1000 * lat.p99,
        "lat_max_ms": 1000 * lat.max,
    }
    if ttft:
        t = summarize(ttft)
        row.update(ttft_mean_ms=1000 * t.mean, ttft_std_ms=1000 * t.std)
        row.update(_ms(ttft, "ttft"))
    row.update(_ms([s.service for s in ok], "service", (50.0, 99.0)))
    late = [s.lateness for s in samples]
    row.update(_ms(late, "late", (50.0, 99.0)))
    row["late_max_ms"] = 1000 * max(late) if late else math.nan
    row["error_kinds"] = error_kinds(samples)
    return row


def error_kinds(samples: Sequence[Sample]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            kinds[s.error] = kinds.get(s.error, 0) + 1
    return kinds


def timeline(samples: Sequence[Sample], t0: float, width_s: float) -> list[Row]:
    """Per window of scheduled time: sends, errors, latency p50/p90/p99."""
    groups = window_index((s.scheduled for s in samples), width_s, t0)
    rows: list[Row] = []
    for w in sorted(groups):
        group = [samples[i] for i in groups[w]]
        ok = [s.latency for s in group if s.error is None]
        p = percentiles(ok) if ok else [math.nan] * 3
        rows.append(
            {
                "t_s": w * width_s,
                "requests": len(group),
                "errors": len(group) - len(ok),
                "lat_p50_ms": 1000 * p[0],
                "lat_p90_ms": 1000 * p[1],
                "lat_p99_ms": 1000 * p[2],
            }
        )
    return rows


@dataclass(slots=True)
class _Window:
    latency: array[float] = field(default_factory=lambda: array("d"))
    ttft: array[float] = field(default_factory=lambda: array("d"))
    errors: int = 0
    out_tokens: int = 0


class WindowRecorder:
    """Keeps only compact per-window arrays (8 bytes a value) so long soaks stay small in memory.

    Samples are windowed by completion time, the moment the result is known.
    """

    def __init__(self, t0: float, width_s: float, keep: bool = False) -> None:
        self.t0 = t0
        self.width_s = width_s
        self.windows: dict[int, _Window] = {}
        self.kept: list[Sample] = []
        self.keep = keep

    def add(self, s: Sample) -> None:
        w = self.windows.get(k := int((s.end - self.t0) // self.width_s))
        if w is None:
            w = self.windows[k] = _Window()
        if s.error is not None:
            w.errors += 1
        else:
            w.latency.append(s.latency)
            w.out_tokens += s.out_tokens
            if not math.isnan(s.first):
                w.ttft.append(s.ttft)
        if self.keep:
            self.kept.append(s)

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        for k in sorted(self.windows):
            w = self.windows[k]
            lat = summarize(w.latency)
            n = lat.count + w.errors
            row: Row = {"t_s": k * self.width_s, "requests": n, "errors": w.errors}
            row.update(
                req_per_s=lat.count / self.width_s, out_tok_per_s=w.out_tokens / self.width_s
            )
            row.update(lat_mean_ms=1000 * lat.mean, lat_p50_ms=1000 * lat.p50)
            row.update(lat_p90_ms=1000 * lat.p90, lat_p99_ms=1000 * lat.p99)
            if w.ttft:
                row.update(_ms(w.ttft, "ttft", (50.0, 99.0)))
            rows.append(row)
        return rows

    def overall(self) -> Row:
        lat: array[float] = array("d")
        errors = 0
        for w in self.windows.values():
            lat.extend(w.latency)
            errors += w.errors
        s = summarize(lat)
        return {
            "requests": s.count + errors,
            "ok": s.count,
            "errors": errors,
            "lat_mean_ms": 1000 * s.mean,
            "lat_p50_ms": 1000 * s.p50,
            "lat_p90_ms": 1000 * s.p90,
            "lat_p99_ms": 1000 * s.p99,
            "lat_max_ms": 1000 * s.max,
        }
