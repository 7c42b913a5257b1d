"""Routing benchmarks: one subcommand per figure, the contenders side by side in one run.

    python -m loadtests.routing_bench goodput [--trial-s 15] [--litellm PATH]
    python -m loadtests.routing_bench at70 --rate R      # R = 0.7 x goodput of (a)
    python -m loadtests.routing_bench hetero [--rate 3.5]
    python -m loadtests.routing_bench affinity [--rate 6]
    python -m loadtests.routing_bench classify

Every run starts the simulated fleet (loadtests/routing/fleet-*.yaml, in a child process), the
gateway as a real `gateway serve` process (loadtests/routing/policy-*.yaml, fleet URLs passed as
SIM_URL_* variables), and sends open-loop Poisson arrivals (same seed, so every contender gets
the same requests at the same times) with the loadtests.bench client. Streams throughout: TTFT is
the first content chunk, counted from the scheduled send time. `--out FILE` saves the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from loadtests.bench.client import Target
from loadtests.routing.harness import (
    HERE,
    fmt,
    gateway,
    litellm,
    meets_slo,
    mixed_workload,
    p,
    prefix_workload,
    send_all,
    short_workload,
    start_fleet,
    summary,
    table,
    wait_idle,
)
from loadtests.simulator.testing import Fleet

# -- figures ----------------------------------------------------------------------------------------
Contender = Callable[[], contextlib.AbstractContextManager[Target]]


def search(trial: Callable[[float], bool], start: float, max_trials: int) -> float:
    """Highest passing rate: double or halve from `start` until bracketed, then bisect (log)."""
    passes: list[float] = []
    fails: list[float] = []
    rate = start
    for _ in range(max_trials):
        (passes if trial(rate) else fails).append(rate)
        lo, hi = max(passes, default=None), min(fails, default=None)
        if hi is None:
            rate = round(2 * lo, 2)  # type: ignore[operator]
        elif lo is None:
            rate = round(hi / 2, 2)
        elif hi / lo <= 1.15:
            break
        else:
            rate = round(math.sqrt(lo * hi), 2)
    return max(passes, default=0.0)


def search_contender(
    fleet: Fleet, target: Target, name: str, start: float, args: argparse.Namespace
) -> tuple[float, list[dict[str, Any]]]:
    """Goodput of one contender, and every trial it took to find it."""
    trials: list[dict[str, Any]] = []
    send_all(target, short_workload(2.0, 3.0, seed=99))  # warm up: connections, first requests

    def trial(rate: float) -> bool:
        wait_idle(fleet)
        reqs = mixed_workload(rate, args.warmup_s + args.trial_s, warmup_s=args.warmup_s)
        s = summary(send_all(target, reqs, cut_longs=True))
        ok = meets_slo(s)
        trials.append({"rate": rate, "pass": ok, **s})
        short, long = s["short"], s.get("long", {})
        print(
            f"  {name} @ {rate} req/s: short p99 TTFT {fmt(short['ttft_p99_s'])} s, "
            f"errors {short['errors']}+{long.get('errors', 0)}, "
            f"cut longs {long.get('cut', 0)} -> {'pass' if ok else 'FAIL'}",
            flush=True,
        )
        return ok

    return search(trial, start, args.max_trials), trials


def goodput(args: argparse.Namespace, wd: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with start_fleet("mixed") as fleet:
        contenders: list[tuple[str, Contender | str, float]] = [
            (
                "a: gateway, one pool, round robin",
                lambda: gateway("mixed-rr", fleet, wd),
                args.start,
            ),
        ]
        for strategy in ("simple-shuffle", "latency-based-routing"):
            name = f"b: LiteLLM proxy, {strategy}"
            if not os.access(args.litellm, os.X_OK):
                contenders.append((name, f"not run: {args.litellm} not found", 0))
            else:
                contenders.append(
                    (name, lambda s=strategy: litellm(args.litellm, s, fleet, wd), args.start)  # type: ignore[misc]
                )
        contenders.append(
            (
                "c: gateway, classes + PeakEWMA",
                lambda: gateway("mixed-classes", fleet, wd),
                2 * args.start,
            )
        )
        for name, make, start in contenders:
            if isinstance(make, str):
                results[name] = {"skipped": make}
                continue
            with make() as target:
                best, trials = search_contender(fleet, target, name, start, args)
            results[name] = {"goodput_rps": best, "trials": trials}
    rows = [
        {
            "contender": n,
            "goodput req/s": r.get("goodput_rps", r.get("skipped")),
            "trials": ", ".join(
                f"{t['rate']}{'+' if t['pass'] else '-'}" for t in r.get("trials", [])
            ),
        }
        for n, r in results.items()
    ]
    print(table(rows, ["contender", "goodput req/s", "trials"]))
    return results


def at70(args: argparse.Namespace, wd: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    reqs = mixed_workload(args.rate, args.duration, seed=7)
    with start_fleet("mixed") as fleet:
        for name, policy in (
            ("a: round robin", "mixed-rr"),
            ("c: classes + PeakEWMA", "mixed-classes"),
        ):
            wait_idle(fleet)
            with gateway(policy, fleet, wd) as target:
                results[name] = summary(send_all(target, reqs))
            print(f"  {name}: {results[name]}", flush=True)
    rows = [
        {
            "contender": n,
            "short TTFT p50 s": r["short"]["ttft_p50_s"],
            "short TTFT p99 s": r["short"]["ttft_p99_s"],
            "long latency p50 s": r["long"]["latency_p50_s"],
            "long latency p99 s": r["long"]["latency_p99_s"],
            "errors": r["short"]["errors"] + r["long"]["errors"],
            "requests": r["requests"],
        }
        for n, r in results.items()
    ]
    print(f"rate {args.rate} req/s for {args.duration} s")
    print(table(rows, list(rows[0])))
    return results


def member_requests(fleet: Fleet) -> dict[str, int]:
    return {n: fleet.stats(n)["requests"] for n in fleet.names}


def hetero(args: argparse.Namespace, wd: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    reqs = short_workload(args.rate, args.duration)
    with start_fleet("hetero") as fleet:
        for strategy in ("round_robin", "p2c_peak_ewma"):
            wait_idle(fleet)
            for n in fleet.names:
                fleet.reset(n)
            with gateway("hetero", fleet, wd, BENCH_STRATEGY=strategy) as target:
                s = summary(send_all(target, reqs))
            results[strategy] = {**s["short"], "per_member": member_requests(fleet)}
            print(f"  {strategy}: {results[strategy]}", flush=True)
    rows = [
        {
            "balancer": k,
            **{
                c: v[c]
                for c in ("ttft_p50_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s", "errors")
            },
            "requests per member": v["per_member"],
        }
        for k, v in results.items()
    ]
    print(f"rate {args.rate} req/s for {args.duration} s")
    print(table(rows, list(rows[0])))
    return results


def affinity(args: argparse.Namespace, wd: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    runs = (
        ("off (P2C only)", "false", None),
        ("on", "true", None),
        ("on, one prefix 50%", "true", 0.5),
    )
    with start_fleet("prefix") as fleet:
        for name, enabled, hot in runs:
            wait_idle(fleet)
            for n in fleet.names:
                fleet.reset(n)
            reqs = prefix_workload(args.rate, args.duration, hot)
            with gateway("prefix", fleet, wd, BENCH_AFFINITY=enabled) as target:
                s = summary(send_all(target, reqs))["short"]
            stats = [fleet.stats(n) for n in fleet.names]
            load = [st["requests"] for st in stats]
            hit = sum(st["prefix_cache_hit_tokens"] for st in stats) / max(
                sum(st["prompt_tokens"] for st in stats), 1
            )
            results[name] = {
                "hit_rate": hit,
                "ttft_mean_s": s["ttft_mean_s"],
                "ttft_p99_s": s["ttft_p99_s"],
                "max_over_mean": max(load) / (sum(load) / len(load)),
                "per_member": load,
                "errors": s["errors"],
                "n": s["n"],
            }
            print(f"  {name}: {results[name]}", flush=True)
    rows = [{"affinity": k, **v} for k, v in results.items()]
    print(f"rate {args.rate} req/s for {args.duration} s")
    print(table(rows, list(rows[0])))
    return results


def classify(args: argparse.Namespace, wd: Path) -> dict[str, Any]:
    """p50 of token estimation (loadtests.classify_cost) and of the whole routing decision."""
    from gateway.policy.loader import load_policy
    from gateway.routing.decision import decide
    from gateway.wire.request import parse_request
    from loadtests.classify_cost import chat_body as cost_body
    from loadtests.classify_cost import measure

    env = {
        k: "http://127.0.0.1:1/v1"
        for k in ("SIM_URL_LL_FAST", "SIM_URL_LL_SLOW", "SIM_URL_BB_A", "SIM_URL_BB_B")
    }
    policy = load_policy(HERE / "policy-mixed-classes.yaml", env=env)
    results: dict[str, Any] = {}
    for tokens in (300, 100_000):
        for kind in ("english", "mixed"):
            est = measure(kind, tokens, args.iterations)
            acc = parse_request(orjson.dumps({**cost_body(kind, tokens), "model": "chat"}), "chat")
            times = []
            for _ in range(args.iterations):
                t0 = time.perf_counter()
                decide(policy, acc, "default", None)
                times.append(time.perf_counter() - t0)
            results[f"{kind} {tokens}"] = {
                "tokens": est["tokens"],
                "estimate_p50_ms": est["p50_ms"],
                "decide_p50_ms": p(times, 50) * 1e3,
                "decide_p99_ms": p(times, 99) * 1e3,
                "rel_err": est["rel_err"],
            }
    rows = [{"prompt": k, **v} for k, v in results.items()]
    print(table(rows, list(rows[0])))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="figure", required=True)
    g = sub.add_parser("goodput", help="highest rate with short p99 TTFT <= 1 s and no errors")
    g.add_argument("--warmup-s", type=float, default=15.0, help="arrivals before measuring")
    g.add_argument("--trial-s", type=float, default=20.0, help="measured arrivals per trial")
    g.add_argument("--max-trials", type=int, default=3)
    g.add_argument("--start", type=float, default=4.0, help="first rate tried ((c) starts at 2x)")
    g.add_argument("--litellm", default="/tmp/litellm-venv/bin/litellm")
    a = sub.add_parser("at70", help="(a) vs (c) at 70%% of (a)'s goodput")
    a.add_argument("--rate", type=float, required=True)
    a.add_argument("--duration", type=float, default=45.0)
    h = sub.add_parser("hetero", help="one pool, one member 3x slower: round robin vs PeakEWMA")
    h.add_argument("--rate", type=float, default=3.5)
    h.add_argument("--duration", type=float, default=40.0)
    f = sub.add_parser("affinity", help="prefix affinity on vs off, and one hot prefix")
    f.add_argument("--rate", type=float, default=6.0)
    f.add_argument("--duration", type=float, default=40.0)
    c = sub.add_parser("classify", help="cost of the routing decision for 300 and 100k tokens")
    c.add_argument("--iterations", type=int, default=200)
    for sp in (g, a, h, f, c):
        sp.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    # Stop the fleet, gateway and LiteLLM children on SIGTERM as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run = {
        "goodput": goodput,
        "at70": at70,
        "hetero": hetero,
        "affinity": affinity,
        "classify": classify,
    }
    t0 = time.monotonic()
    print(
        f"{args.figure}: load average before {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as tmp:
        results = run[args.figure](args, Path(tmp))
    print(f"{args.figure}: {time.monotonic() - t0:.0f} s")
    if args.out:
        args.out.write_text(
            orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
        )


if __name__ == "__main__":
    main()
