"""What the chaos benchmark measured, per phase, and each target met or missed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from loadtests.bench.stats import percentiles

KINDS = ("succeeded", "degraded", "shed", "failed", "broken", "lost")
MAIN_POOL = ("p1", "p2", "p3")


@dataclass
class Outcome:
    phase: str
    kind: str  # one of KINDS
    latency_s: float
    stream: bool = False
    deferred: str | None = None
    detail: str = ""  # status and body end of anything but a success
    ended: str = ""  # the phase when the answer was complete
    provider: str = ""
    end_s: float = 0.0  # when it was complete (benchmark clock)
    hedged: bool = False


@dataclass
class Run:
    """Everything measured, in one place."""

    t0: float = field(default_factory=time.monotonic)
    phase: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)  # (t, what happened)
    # (t, replica, provider, breaker state)
    transitions: list[tuple[float, str, str, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, what: str) -> float:
        t = self.now()
        self.marks.append((t, what))
        print(f"  {t:7.2f}s  {what}", flush=True)
        return t


def first_after(
    transitions: list[tuple[float, str, str, str]],
    t: float,
    replica: str,
    provider: str,
    state: str,
) -> float | None:
    for when, rep, prov, st in transitions:
        if when >= t and rep == replica and prov == provider and st == state:
            return when
    return None


def breaker_times(run: Run) -> list[dict[str, Any]]:
    """For each outage mark: time to open (per provider), and from its recovery to closed."""
    out = []
    marks = run.marks
    for i, (t, what) in enumerate(marks):
        if not what.startswith("fault "):
            continue
        name = what.split()[1]
        recovered = next(
            (tr for tr, w in marks[i:] if w.startswith("recovered") and name in w.split()[1]), None
        )
        opened = first_after(run.transitions, t, "r1", name, "open")
        if opened is not None and recovered is not None and opened > recovered:
            opened = None
        closed = None
        if recovered is not None:
            closed = first_after(run.transitions, recovered, "r1", name, "closed")
        out.append(
            {
                "fault": what,
                "open_after_s": None if opened is None else round(opened - t, 3),
                "closed_after_recovery_s": None
                if closed is None or opened is None or recovered is None
                else round(closed - recovered, 3),
            }
        )
    return out


def recovery_times(run: Run, window_s: float = 1.0, step_s: float = 0.25) -> list[dict[str, Any]]:
    """After each single-member fault ends: when that member answered again, and when it was
    back in rotation (at least half its fair share of the pool's answers over `window_s`)."""
    out = []
    answered = [o for o in run.outcomes if o.kind == "succeeded" and o.provider in MAIN_POOL]
    for t, what in run.marks:
        if not what.startswith("recovered "):
            continue
        names = what.split()[1].split(",")
        if len(names) != 1 or names[0] not in MAIN_POOL:
            continue
        name = names[0]
        if any(
            t < tf <= t + 5.0 and w.startswith("fault ") and w.split()[1] == name
            for tf, w in run.marks
        ):
            continue  # the next phase fails it again at once: nothing to measure
        slow = _slow_fault(run, t, name)
        first = min(
            (o.end_s for o in answered if o.provider == name and o.end_s >= t), default=None
        )
        back = None
        start = t
        while start < t + 30.0:
            got = [o for o in answered if start <= o.end_s < start + window_s]
            if len(got) >= 5 and sum(o.provider == name for o in got) / len(got) >= 1 / 6:
                back = start + window_s
                break
            start += step_s
        out.append(
            {
                "member": name,
                "fault": slow or "fast",
                "fault_ended_at_s": round(t, 2),
                "first_answer_after_s": None if first is None else round(first - t, 2),
                "back_in_rotation_after_s": None if back is None else round(back - t, 2),
            }
        )
    return out


# Faults whose requests keep failing after the fault ends: those already in flight still hang or
# trickle until their own limit (first_byte_s + max_tokens / unary_min_tps in the chaos policy).
SLOW_FAULTS = ("'hang'", "'trickle_bytes_per_s'")
SLOW_ALLOWANCE_S = 3.0 + 16 / 20


def _slow_fault(run: Run, t: float, name: str) -> str | None:
    """The kind of the last fault of `name` before `t` when it is a slow one (hang, trickle)."""
    last = [w for tf, w in run.marks if tf <= t and w.startswith(f"fault {name} ")]
    if last and any(k in last[-1] for k in SLOW_FAULTS):
        return "slow"
    return None


def propagation(run: Run) -> dict[str, Any]:
    """Phase 8: when each replica saw p1 open, and the gap between them."""
    start = next(t for t, w in run.marks if w.startswith("phase: 8"))
    one = first_after(run.transitions, start, "r1", "p1", "open")
    two = first_after(run.transitions, start, "r2", "p1", "open")
    gap = None if one is None or two is None else round(two - one, 3)
    return {"r1_open_at_s": one, "r2_open_at_s": two, "r2_after_r1_s": gap}


def phase_table(run: Run) -> list[dict[str, Any]]:
    rows = []
    for name in dict.fromkeys(o.phase for o in run.outcomes):
        got = [o for o in run.outcomes if o.phase == name]
        kinds = {k: sum(o.kind == k for o in got) for k in KINDS}
        answered = [o.latency_s for o in got if o.kind != "lost"]
        unary = [o.latency_s for o in got if o.kind != "lost" and not o.stream]
        p50, p99 = percentiles(answered, (50.0, 99.0)) if answered else (float("nan"),) * 2
        (u99,) = percentiles(unary, (99.0,)) if unary else (float("nan"),)
        sent = run.sent.get(name, 0)
        rows.append(
            {
                "phase": name,
                "sent": sent,
                **kinds,
                "no_answer": sent - len(got),
                "success_pct": round(100 * kinds["succeeded"] / max(1, sent), 2),
                "p50_ms": round(p50 * 1000, 1),
                "p99_ms": round(p99 * 1000, 1),
                "unary_p99_ms": round(u99 * 1000, 1),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ["phase", "sent", *KINDS, "success_pct", "p50_ms", "p99_ms", "unary_p99_ms"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _row(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["phase"].split()[0] == prefix), None)


def targets(
    rows: list[dict[str, Any]], info: dict[str, Any], outcomes: list[Outcome]
) -> list[tuple[str, bool, str]]:
    """The benchmark's targets, each with whether it was met and the measured figure."""
    # "While a provider is healthy": not the deliberate total outages (phases 5 and 17), nor the
    # requests they caught, nor the killed worker's phase (its in-flight requests die with it).
    outage = ("5", "17", "18")
    healthy = [
        o
        for o in outcomes
        if o.phase.split()[0] not in outage and o.ended.split()[0] not in outage[:2]
    ]
    by_phase: dict[str, list[Outcome]] = {}
    for o in healthy:
        by_phase.setdefault(o.phase, []).append(o)
    pct = {
        p: 100 * sum(o.kind == "succeeded" for o in got) / len(got) for p, got in by_phase.items()
    }
    worst = min(pct, key=lambda p: pct[p])
    broken = [r["phase"] for r in rows if r["broken"]]
    answered_all = all(
        r["lost"] == 0 and r["no_answer"] == 0 for r in rows if not r["phase"].startswith("18")
    )
    # A hang or a trickle can only be seen failing after first_byte_s (+ max_tokens / tps).
    opens = [
        round(
            b["open_after_s"]
            - (SLOW_ALLOWANCE_S if any(k in b["fault"] for k in SLOW_FAULTS) else 0),
            3,
        )
        for b in info["breakers"]
        if b["open_after_s"] is not None
    ]
    closes_allowed = [
        info["max_cooldown_s"]
        + 1
        + (SLOW_ALLOWANCE_S if any(k in b["fault"] for k in SLOW_FAULTS) else 0)
        for b in info["breakers"]
        if b["closed_after_recovery_s"] is not None
    ]
    closes = [
        b["closed_after_recovery_s"]
        for b in info["breakers"]
        if b["closed_after_recovery_s"] is not None
    ]
    redis_row = _row(rows, "7")
    replay = info["replay"]
    gap = info["propagation"]["r2_after_r1_s"]
    back = [r["back_in_rotation_after_s"] for r in info["recovery"]]
    slow = [_row(rows, p) for p in ("13", "14")]
    slow_p99 = [r["unary_p99_ms"] for r in slow if r is not None]
    # Requests sent and finished within the reload phase (not those the next outage caught).
    reload_bad = [
        o
        for o in outcomes
        if o.phase.startswith("16") and o.ended.startswith("16") and o.kind not in ("succeeded",)
    ]
    restart = info.get("redis_restart", {})
    worker = info.get("worker_kill", {})
    out = [
        (
            ">= 99.9% undegraded success while a provider is healthy",
            pct[worst] >= 99.9,
            f"worst {pct[worst]:.2f}% ({worst}; total outages and the killed worker excluded)",
        ),
        (
            "no broken answer passed as a success (content checked word for word)",
            not broken,
            f"phases with broken answers: {broken or 'none'}",
        ),
        (
            "every request answered, none lost (killed worker's phase apart)",
            answered_all,
            "table",
        ),
        (
            "breaker opens within 1 s of the first failure it can see (hang, trickle: the fault "
            f"start + {SLOW_ALLOWANCE_S} s)",
            bool(opens) and max(opens) <= 1.0,
            f"opens {opens} (after that allowance)",
        ),
        (
            f"breaker closes within cooldown + 1 s (<= {info['max_cooldown_s'] + 1} s; hang, "
            f"trickle: + {SLOW_ALLOWANCE_S} s for the requests still in flight)",
            bool(closes) and all(c <= a for c, a in zip(closes, closes_allowed, strict=True)),
            f"closes {closes}",
        ),
        (
            f"a recovered member is back in rotation within 5 s (hang, trickle: + {SLOW_ALLOWANCE_S} s)",
            bool(back)
            and all(
                b is not None and b <= 5.0 + (SLOW_ALLOWANCE_S if r["fault"] == "slow" else 0)
                for b, r in zip(back, info["recovery"], strict=True)
            ),
            f"back after {back} s",
        ),
        (
            "Redis down: zero failed",
            redis_row is not None and redis_row["failed"] + redis_row["lost"] == 0,
            "phase 7",
        ),
        (
            "every queued request replayed",
            bool(replay) and all(s == "done" for s in replay.values()),
            f"{sum(s == 'done' for s in replay.values())}/{len(replay)} done",
        ),
        ("replica 2 stops within 1 s of replica 1", gap is not None and gap <= 1.0, f"{gap} s"),
        (
            "hang before headers / slow trickle: unary p99 within the attempt's limits (headers "
            f"{SLOW_ALLOWANCE_S} s, body idle 3 s after them) + 1 s = 7.8 s, not total_s (20 s)",
            bool(slow_p99) and max(slow_p99) <= 7800,
            f"unary p99 {slow_p99} ms",
        ),
        (
            "two reloads in quick succession: every request answered in full",
            not reload_bad,
            f"{len(reload_bad)} not succeeded: {sorted({o.kind for o in reload_bad})}",
        ),
    ]
    if restart:
        out.append(
            (
                "Redis restarted empty: requests queued after it returned are replayed",
                restart["after"]["total"] == restart["after"]["done"],
                f"after the restart {restart['after']}; before it {restart['before']}",
            )
        )
    if worker:
        out.append(
            (
                "worker killed: replaced by the parent within 5 s",
                worker.get("replaced_after_s") is not None and worker["replaced_after_s"] <= 5.0,
                f"{worker}",
            )
        )
    return out
