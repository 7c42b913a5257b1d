"""Several endpoints in one run, interleaved so machine noise hits each of them alike.

``compare``: any endpoints, ratios against the first. ``overhead``: an upstream reached directly
versus through a gateway (and optionally a peer gateway): added latency at one client and at fixed
open-loop rates, the highest sustained throughput, and CPU time per request and RSS of named
processes during each phase.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import wrk
from .client import Sample, Target
from .engine import closed_loop
from .measures import summary_row
from .modes import run_open
from .procstat import PhaseMeter
from .prompts import chat_body
from .result import Bench, Result, Row
from .schedule import Arrival, send_times
from .stats import ratio

RATIO_KEYS = ("lat_p50_ms", "lat_p90_ms", "lat_p99_ms", "ttft_p50_ms", "req_per_s")


def rotated(targets: list[Target], r: int) -> list[Target]:
    """Round ``r``'s order: each target goes first equally often."""
    k = r % len(targets)
    return targets[k:] + targets[:k]


@dataclass
class _Book:
    """Samples, wall time and per-process CPU per (phase, target)."""

    meter: PhaseMeter
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    wall: dict[tuple[str, str], float] = field(default_factory=dict)
    cpu: dict[tuple[str, str, str], float] = field(default_factory=dict)
    rss: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def sink(self, b: Bench, key: tuple[str, str]) -> Callable[[Sample], None]:
        out = self.samples.setdefault(key, [])

        def add(s: Sample) -> None:
            out.append(s)
            b.progress.count(s)

        return add

    def close(self, key: tuple[str, str], wall_s: float) -> None:
        self.wall[key] = self.wall.get(key, 0.0) + wall_s
        for proc, d in self.meter.stop().items():
            self.cpu[(*key, proc)] = self.cpu.get((*key, proc), 0.0) + d.cpu_s
            self.rss[(*key, proc)] = d.rss_end / 2**20

    def rows(self, phase: str) -> list[Row]:
        return [
            {"target": t, **summary_row(s, self.wall[(p, t)])}
            for (p, t), s in self.samples.items()
            if p == phase
        ]

    def proc_rows(self) -> list[Row]:
        rows: list[Row] = []
        for (phase, target, proc), cpu_s in self.cpu.items():
            n = len(self.samples.get((phase, target), ()))
            rows.append(
                {
                    "phase": phase,
                    "target": target,
                    "process": proc,
                    "cpu_s": cpu_s,
                    "cpu_ms_per_request": 1000 * cpu_s / n if n else math.nan,
                    "rss_mb": self.rss[(phase, target, proc)],
                }
            )
        return rows


def add_ratios(rows: list[Row], keys: tuple[str, ...] = RATIO_KEYS, added: bool = False) -> None:
    """Ratios (and, for overhead, differences in ms) of each row against the first."""
    if not rows:
        return
    ref = rows[0]
    for row in rows:
        for k in keys:
            if k in row and k in ref:
                v, r = float(row[k]), float(ref[k])
                row[f"{k}_ratio"] = ratio(v, r)
                if added and k.endswith("_ms"):
                    row[f"added_{k}"] = v - r


async def _closed_rounds(
    b: Bench, book: _Book, phase: str, rounds: int, per_round: int, concurrency: int
) -> None:
    async with b.progress.phase(phase, None, rounds * per_round * len(b.targets)):
        for r in range(rounds):
            for t in rotated(b.targets, r):
                book.meter.start()
                stats = await closed_loop(
                    b.sender(t, phase),
                    book.sink(b, (phase, t.name)),
                    concurrency,
                    math.inf,
                    per_round,
                )
                book.close((phase, t.name), stats.wall_s)


async def compare(b: Bench, rounds: int, per_round: int, concurrency: int) -> Result:
    """``rounds`` rounds; in each, every target gets ``per_round`` requests at ``concurrency``."""
    book = _Book(PhaseMeter({}))
    cfg = {
        "targets": {t.name: t.url for t in b.targets},
        "rounds": rounds,
        "per_round": per_round,
        "concurrency": concurrency,
    }
    res = Result("compare", cfg, t0=time.perf_counter())
    await _closed_rounds(b, book, "compare", rounds, per_round, concurrency)
    rows = book.rows("compare")
    add_ratios(rows)
    res.tables["compare"] = rows
    res.samples = [s for v in book.samples.values() for s in v]
    for row in rows[1:]:
        res.notes.append(
            f"{row['target']}: p50 x{row['lat_p50_ms_ratio']:.2f}, "
            f"p99 x{row['lat_p99_ms_ratio']:.2f} vs {rows[0]['target']}"
        )
    return res


@dataclass(frozen=True)
class OverheadPlan:
    """The phases of an overhead run and their sizes."""

    rounds: int = 5
    one_client_requests: int = 200  # per target, over all rounds
    rates: tuple[float, ...] = (200.0, 500.0)
    rate_s: float = 10.0  # per rate and target, over all rounds
    concurrency: tuple[int, ...] = (1, 4, 16, 64, 256)
    step_s: float = 3.0
    arrival: Arrival = "poisson"
    use_wrk: bool = False
    max_inflight: int = 4096


async def overhead(b: Bench, plan: OverheadPlan, pids: dict[str, int]) -> Result:
    """Targets are ``[direct, gateway, (peer)]``; every figure is also given against direct."""
    book = _Book(PhaseMeter(pids))
    cfg = {
        "targets": {t.name: t.url for t in b.targets},
        "stream": b.stream,
        "pids": pids,
        **{k: v for k, v in plan.__dict__.items()},
    }
    res = Result("overhead", cfg, t0=time.perf_counter())
    per_round = max(plan.one_client_requests // plan.rounds, 1)
    await _closed_rounds(b, book, "one_client", plan.rounds, per_round, 1)
    rows = book.rows("one_client")
    add_ratios(rows, added=True)
    res.tables["one_client"] = rows
    res.tables["rates"] = await _rate_phases(b, book, plan)
    res.tables["throughput"], res.tables["max_throughput"] = await _throughput(b, book, plan)
    res.tables["process"] = book.proc_rows()
    res.samples = [s for v in book.samples.values() for s in v]
    _overhead_notes(res)
    return res


async def _rate_phases(b: Bench, book: _Book, plan: OverheadPlan) -> list[Row]:
    out: list[Row] = []
    slice_s = plan.rate_s / plan.rounds
    for rate in plan.rates:
        phase = f"rate={rate:g}"
        for r in range(plan.rounds):
            for t in rotated(b.targets, r):
                offsets = send_times(plan.arrival, rate, slice_s, b.max_requests, seed=r)
                book.meter.start()
                samples, _, _ = await run_open(
                    b, offsets, f"{phase} {t.name}", plan.max_inflight, target=t
                )
                key = (phase, t.name)
                book.samples.setdefault(key, []).extend(samples)
                book.close(key, slice_s)
        rows = [{"rate": rate, **row} for row in book.rows(phase)]
        add_ratios(rows, added=True)
        out.extend(rows)
    return out


async def _throughput(b: Bench, book: _Book, plan: OverheadPlan) -> tuple[list[Row], list[Row]]:
    """Closed loop at rising concurrency (or wrk); the best error-free step per target."""
    rows: list[Row] = []
    for c in plan.concurrency:
        phase = f"c={c}"
        for t in rotated(b.targets, c):
            book.meter.start()
            if plan.use_wrk:
                prompt = f"{wrk.NONCE} {b.factory.prompt(unique=False)}"
                body = chat_body(t.model, prompt, b.factory.max_tokens, b.stream).decode()
                row: Row = {
                    "target": t.name,
                    "tool": "wrk",
                    **wrk.run(t.endpoint, body, t.api_key, c, plan.step_s),
                }
                book.samples.setdefault((phase, t.name), [])
                book.close((phase, t.name), plan.step_s)
            else:
                async with b.progress.phase(f"{phase} {t.name}", plan.step_s):
                    stats = await closed_loop(
                        b.sender(t, phase),
                        book.sink(b, (phase, t.name)),
                        c,
                        plan.step_s,
                        b.max_requests,
                    )
                book.close((phase, t.name), stats.wall_s)
                row = {
                    "target": t.name,
                    "tool": "bench",
                    **summary_row(book.samples[(phase, t.name)], stats.wall_s),
                }
            rows.append({"concurrency": c, **row})
    best: list[Row] = []
    for t in b.targets:
        mine = [r for r in rows if r["target"] == t.name and _error_free(r)]
        top = max(mine, key=lambda r: float(r["req_per_s"]), default=None)
        best.append(
            {
                "target": t.name,
                "max_req_per_s": top["req_per_s"] if top else math.nan,
                "at_concurrency": top["concurrency"] if top else None,
            }
        )
    add_ratios(best, ("max_req_per_s",))
    return rows, best


def _error_free(row: Row) -> bool:
    """A step counts as sustained when under 1% of its requests failed."""
    n = float(row.get("requests", 0) or 0)
    errors = float(row.get("errors", 0) or 0) + float(row.get("non_2xx", 0) or 0)
    errors += float(row.get("socket_errors", 0) or 0)
    return n > 0 and errors / n < 0.01


def _overhead_notes(res: Result) -> None:
    for row in res.tables["one_client"][1:]:
        res.notes.append(
            f"one client, {row['target']}: added p50 {row['added_lat_p50_ms']:.3f} ms, "
            f"p99 {row['added_lat_p99_ms']:.3f} ms"
        )
    direct = res.tables["one_client"][0]["target"] if res.tables["one_client"] else None
    for row in res.tables["rates"]:
        if row["target"] != direct and "added_lat_p50_ms" in row:
            res.notes.append(
                f"{row['rate']:g} req/s, {row['target']}: added p50 "
                f"{row['added_lat_p50_ms']:.3f} ms, p99 {row['added_lat_p99_ms']:.3f} ms"
            )
    for row in res.tables["max_throughput"]:
        res.notes.append(
            f"max sustained {row['target']}: {row['max_req_per_s']:.0f} req/s "
            f"(c={row['at_concurrency']})"
        )
