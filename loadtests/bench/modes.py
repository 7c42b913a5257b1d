"""Single-target benchmarks: baseline, stepped, openloop, soak, coldstart, replay."""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from .client import Client, Sample, Target
from .engine import closed_loop, open_loop
from .measures import WindowRecorder, summary_row, timeline
from .procstat import Sampler
from .result import Bench, Result, Row
from .schedule import Arrival, send_times
from .stats import percentiles, ratio


def _collect(b: Bench, out: list[Sample]) -> Callable[[Sample], None]:
    def sink(s: Sample) -> None:
        out.append(s)
        b.progress.count(s)

    return sink


async def baseline(b: Bench, repeats: int, warmup: int = 1) -> Result:
    """``repeats`` sequential requests after ``warmup`` unrecorded ones."""
    target = b.targets[0]
    for _ in range(warmup):
        await b.send(target, "warmup")
    res = Result("baseline", {"repeats": repeats, "warmup": warmup}, t0=time.perf_counter())
    sink = _collect(b, res.samples)
    async with b.progress.phase("baseline", None, repeats):
        stats = await closed_loop(b.sender(target, "baseline"), sink, 1, math.inf, repeats)
    res.tables["baseline"] = [summary_row(res.samples, stats.wall_s)]
    return res


async def stepped(b: Bench, steps: list[int], step_s: float) -> Result:
    """Closed-loop steps of increasing concurrency, ``step_s`` seconds each."""
    target = b.targets[0]
    res = Result("stepped", {"steps": steps, "step_s": step_s}, t0=time.perf_counter())
    rows: list[Row] = []
    for c in steps:
        step: list[Sample] = []
        tag = f"c={c}"
        async with b.progress.phase(f"concurrency {c}", step_s):
            stats = await closed_loop(
                b.sender(target, tag),
                _collect(b, step),
                c,
                step_s,
                b.max_requests,
            )
        rows.append({"concurrency": c, **summary_row(step, stats.wall_s)})
        res.samples.extend(step)
    res.tables["steps"] = rows
    best = max(rows, key=lambda r: float(r["req_per_s"]))
    res.notes.append(f"peak {best['req_per_s']:.1f} req/s at concurrency {best['concurrency']}")
    return res


Fire = Callable[[int, float], Awaitable[Sample]]


async def run_open(
    b: Bench,
    offsets: list[float],
    tag: str,
    max_inflight: int,
    fire: Fire | None = None,
    target: Target | None = None,
) -> tuple[list[Sample], Row, float]:
    """One open-loop phase (default: the first target); returns samples, summary row, start."""
    target = target or b.targets[0]
    samples: list[Sample] = []

    async def default_fire(i: int, scheduled: float) -> Sample:
        return await b.send(target, tag, scheduled)

    seconds = offsets[-1] if offsets else 0.0
    async with b.progress.phase(tag, seconds or None, len(offsets)):
        stats = await open_loop(
            fire or default_fire, _collect(b, samples), offsets, max_inflight, b.drain_s
        )
    row = summary_row(samples, stats.wall_s)
    span = offsets[-1] - offsets[0] if len(offsets) > 1 else 0.0
    sends = sorted(s.sent for s in samples)
    sent_span = sends[-1] - sends[0] if len(sends) > 1 else 0.0
    row.update(
        scheduled_rate=(len(offsets) - 1) / span if span > 0 else math.nan,
        achieved_send_rate=(len(sends) - 1) / sent_span if sent_span > 0 else math.nan,
        unfinished=stats.unfinished,
    )
    return samples, row, stats.started


async def openloop(
    b: Bench,
    rate: float,
    duration_s: float | None,
    count: int | None,
    arrival: Arrival = "poisson",
    seed: int = 0,
    max_inflight: int = 4096,
    window_s: float = 1.0,
) -> Result:
    """Requests at ``rate``/s (constant or Poisson), latency from each scheduled time."""
    count = min(count or b.max_requests, b.max_requests)
    offsets = send_times(arrival, rate, duration_s, count, seed)
    cfg = {
        "rate": rate,
        "duration_s": duration_s,
        "count": count,
        "arrival": arrival,
        "seed": seed,
        "max_inflight": max_inflight,
    }
    samples, row, t0 = await run_open(b, offsets, "openloop", max_inflight)
    res = Result("openloop", cfg, samples=samples, t0=t0)
    res.tables["openloop"] = [row]
    res.tables["timeline"] = timeline(samples, t0, window_s)
    _lateness_note(res, row)
    return res


def _lateness_note(res: Result, row: Row) -> None:
    late99 = float(row["late_p99_ms"])
    if late99 > 10:
        res.notes.append(
            f"generator or in-flight cap was late: send lateness p99 {late99:.1f} ms "
            "(latencies include it; lower the rate or raise --max-inflight to measure the target)"
        )


async def soak(
    b: Bench,
    rate: float,
    duration_s: float,
    window_s: float,
    pids: dict[str, int],
    sample_s: float = 1.0,
    arrival: Arrival = "poisson",
    seed: int = 0,
    max_inflight: int = 4096,
    keep_samples: bool = False,
) -> Result:
    """Long open-loop run: per-window percentiles and errors, drift, process CPU and RSS."""
    offsets = send_times(arrival, rate, duration_s, b.max_requests, seed)
    t0 = time.perf_counter() + 0.05
    rec = WindowRecorder(t0, window_s, keep_samples)
    sampler = Sampler({"generator": os.getpid(), **pids}, sample_s)
    target = b.targets[0]

    def sink(s: Sample) -> None:
        rec.add(s)
        b.progress.count(s)

    async def fire(i: int, scheduled: float) -> Sample:
        return await b.send(target, "soak", scheduled)

    sampler.start()
    async with b.progress.phase("soak", duration_s):
        stats = await open_loop(fire, sink, offsets, max_inflight, b.drain_s, start=t0)
    await sampler.stop()
    cfg = {"rate": rate, "duration_s": duration_s, "window_s": window_s, "pids": pids}
    res = Result("soak", cfg, samples=rec.kept, t0=t0)
    rows = rec.rows()
    _attach_process(rows, sampler, t0, window_s)
    res.tables["windows"] = rows
    res.tables["overall"] = [
        {**rec.overall(), "wall_s": stats.wall_s, "unfinished": stats.unfinished}
    ]
    res.tables["drift"] = _drift(rows, sampler, duration_s, window_s)
    return res


def _attach_process(rows: list[Row], sampler: Sampler, t0: float, window_s: float) -> None:
    """Add each process's RSS (end of window) and CPU % (over the window) to the window rows."""
    for name, series in sampler.series.items():
        for row in rows:
            lo, hi = t0 + float(row["t_s"]), t0 + float(row["t_s"]) + window_s
            inside = [p for p in series if lo <= p.t <= hi]
            if len(inside) >= 2:
                cpu = (inside[-1].cpu_s - inside[0].cpu_s) / (inside[-1].t - inside[0].t)
                row[f"{name}_cpu_pct"] = 100 * cpu
            if inside:
                row[f"{name}_rss_mb"] = inside[-1].rss_bytes / 2**20


def _drift(rows: list[Row], sampler: Sampler, duration_s: float, window_s: float) -> list[Row]:
    """The end of the run against its start, and RSS growth per process.

    Latency: the median over the last tenth of complete windows against the median over the first
    tenth (one window each when there are fewer than 20): a single window's p99 rests on a few
    requests and one pause would decide the comparison. RSS: last sample against the first, and
    against the sample at the end of the first tenth (``ratio_after_warmup``: caches and pools
    fill at the start and then should stay flat).
    """
    full = [r for r in rows if float(r["t_s"]) + window_s <= duration_s + 1e-9]
    out: list[Row] = []
    if len(full) >= 2:
        k = max(1, len(full) // 10)
        for key in ("lat_p50_ms", "lat_p99_ms", "req_per_s", "errors"):
            a = statistics.median(float(r[key]) for r in full[:k])
            z = statistics.median(float(r[key]) for r in full[-k:])
            out.append({"metric": key, "first": a, "last": z, "ratio": ratio(z, a), "windows": k})
    for name, series in sampler.series.items():
        if len(series) >= 2:
            a, z = series[0].rss_bytes / 2**20, series[-1].rss_bytes / 2**20
            t_warm = series[0].t + (series[-1].t - series[0].t) / 10
            warm = next(p for p in series if p.t >= t_warm).rss_bytes / 2**20
            hours = (series[-1].t - series[0].t) / 3600
            out.append(
                {
                    "metric": f"{name}_rss_mb",
                    "first": a,
                    "last": z,
                    "ratio": ratio(z, a),
                    "ratio_after_warmup": ratio(z, warm),
                    "mb_per_hour": (z - a) / hours if hours > 0 else math.nan,
                }
            )
    return out


async def coldstart(b: Bench, idle_s: float, rounds: int, warm: int) -> Result:
    """Per round: a fresh connection's first request after ``idle_s`` idle, then ``warm`` more."""
    target = b.targets[0]
    res = Result(
        "coldstart", {"idle_s": idle_s, "rounds": rounds, "warm": warm}, t0=time.perf_counter()
    )
    rows: list[Row] = []
    for r in range(rounds):
        if r:
            async with b.progress.phase(f"idle {idle_s:g}s", idle_s):
                await asyncio.sleep(idle_s)
        async with Client(8, b.client.timeout.total or 60.0) as fresh:
            body = b.factory.next(target.model)
            cold = await fresh.send(target, body, b.stream, None, "cold")
            warm_samples = [
                await fresh.send(target, b.factory.next(target.model), b.stream, None, "warm")
                for _ in range(warm)
            ]
        res.samples += [cold, *warm_samples]
        warm_p50 = percentiles([s.latency for s in warm_samples if s.error is None], [50.0])[0]
        rows.append(
            {
                "round": r,
                "cold_ms": 1000 * cold.latency,
                "cold_error": cold.error,
                "cold_ttft_ms": 1000 * cold.ttft,
                "warm_p50_ms": 1000 * warm_p50,
            }
        )
    res.tables["rounds"] = rows
    cold_all = [s for s in res.samples if s.tag == "cold"]
    warm_all = [s for s in res.samples if s.tag == "warm"]
    summary = {"cold": summary_row(cold_all, 0.0), "warm": summary_row(warm_all, 0.0)}
    res.tables["summary"] = [{"kind": k, **v} for k, v in summary.items()]
    c50, w50 = summary["cold"]["lat_p50_ms"], summary["warm"]["lat_p50_ms"]
    res.notes.append(f"cold p50 / warm p50 = {ratio(float(c50), float(w50)):.2f}")
    return res
