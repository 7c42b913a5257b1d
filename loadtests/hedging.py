"""Hedging benchmark: tail latency of non-streamed requests when one member has latency spikes.

    python -m loadtests.hedging [--rate 20] [--phase-s 20] [--out hedging.json]

Three simulated members (low-latency profile) in one pool behind a real `gateway serve`, open-loop
unary load (max_tokens 16). Two gateway configurations, one after the other: hedging off (the
default) and hedging on (`hedge: {enabled: true}`: after the pool's observed p95, or the
`--percentile` given). Each runs two
phases: all members healthy, then a latency spike on one member (5% of its answers take 10 s).
Reported per phase: p50/p99/max latency from the scheduled send time, the share of hedged answers,
and the extra upstream load (upstream requests per client request - 1, counted by the simulators).

Target: with hedging, the spike phase's p99 is at most 2x the healthy phase's p99, for an extra
upstream load within the retry budget (20% by default). Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.bench.stats import percentiles
from loadtests.chaos_procs import start_gateway
from loadtests.simulator.testing import Fleet, spawn_fleet

MEMBERS = ("h1", "h2", "h3")
SPIKE = {"spike_rate": 0.05, "spike_ms": 10_000}


def policy(fleet: Fleet, hedge: bool, percentile: float = 95.0) -> str:
    providers = "\n".join(
        f"  {n}: {{base_url: '{fleet.url(n)}', max_inflight: 64, "
        "timeouts: {connect_s: 1, first_byte_s: 15, idle_s: 15, total_s: 30}}"
        for n in MEMBERS
    )
    hedging = f"    hedge: {{enabled: true, percentile: {percentile}}}\n" if hedge else ""
    return f"""
providers:
{providers}
pools:
  main:
    members: [{", ".join(MEMBERS)}]
{hedging}models:
  chat: {{pool: main}}
"""


async def one(
    session: aiohttp.ClientSession, url: str, scheduled: float, out: list[dict[str, Any]]
) -> None:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": f"{uuid.uuid4().hex} hello"}],
        "max_tokens": 16,
    }
    ok, hedged, provider = False, False, ""
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            raw = await r.read()
            ok = r.status == 200 and b'"choices"' in raw
            hedged = r.headers.get("x-gateway-hedged") == "true"
            provider = r.headers.get("x-gateway-provider", "")
    except (aiohttp.ClientError, TimeoutError):
        pass
    out.append(
        {
            "latency_s": time.monotonic() - scheduled,
            "ok": ok,
            "hedged": hedged,
            "provider": provider,
        }
    )


async def phase(url: str, rate: float, seconds: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        tasks = []
        start = time.monotonic()
        n = int(rate * seconds)
        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, url, scheduled, out)))
        await asyncio.gather(*tasks)
    return out


def upstream_requests(fleet: Fleet) -> int:
    return sum(int(fleet.stats(n)["by_endpoint"].get("chat", 0)) for n in MEMBERS)


def summary(name: str, got: list[dict[str, Any]], upstream: int) -> dict[str, Any]:
    lat = [g["latency_s"] for g in got]
    p50, p99 = percentiles(lat, (50.0, 99.0))
    return {
        "phase": name,
        "requests": len(got),
        "ok": sum(g["ok"] for g in got),
        "p50_ms": round(p50 * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "max_ms": round(max(lat) * 1000, 1),
        "hedged_pct": round(100 * sum(g["hedged"] for g in got) / len(got), 2),
        "extra_upstream_pct": round(100 * (upstream / len(got) - 1), 2),
    }


async def run_config(fleet: Fleet, hedge: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="hedging-"))
    path = tmp / "policy.yaml"
    path.write_text(policy(fleet, hedge, args.percentile))
    proc, url = start_gateway({"GATEWAY_POLICY": str(path)}, tmp / "gateway.log")
    rows = []
    try:
        label = "hedging on" if hedge else "hedging off"
        await phase(url, args.rate, 3)  # warm-up: connections, latency estimates, hedge delay
        for name, faults in (("healthy", None), ("spike on h1", SPIKE)):
            if faults:
                fleet.set_faults("h1", **faults)
            before = upstream_requests(fleet)
            got = await phase(url, args.rate, args.phase_s)
            rows.append(summary(f"{label}: {name}", got, upstream_requests(fleet) - before))
            fleet.clear_faults("h1")
            print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    fleet = spawn_fleet([{"name": n, "profile": "low-latency"} for n in MEMBERS])
    try:
        rows = []
        for hedge in (False, True):
            rows += await run_config(fleet, hedge, args)
    finally:
        fleet.close()
    on_healthy = next(r for r in rows if r["phase"] == "hedging on: healthy")
    on_spike = next(r for r in rows if r["phase"] == "hedging on: spike on h1")
    ratio = on_spike["p99_ms"] / on_healthy["p99_ms"]
    return {
        "rate": args.rate,
        "phase_s": args.phase_s,
        "percentile": args.percentile,
        "rows": rows,
        "target": {
            "spike p99 <= 2x healthy p99 (hedging on)": ratio <= 2.0,
            "ratio": round(ratio, 2),
            "extra upstream load in the spike phase (%)": on_spike["extra_upstream_pct"],
        },
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ["phase", "requests", "ok", "p50_ms", "p99_ms", "max_ms", "hedged_pct"]
    cols.append("extra_upstream_pct")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.hedging", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase")
    parser.add_argument(
        "--percentile", type=float, default=95.0, help="hedge after this observed percentile"
    )
    parser.add_argument("--out", type=Path, default=Path("hedging.json"))
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print()
    print(markdown(result["rows"]))
    print()
    print(result["target"])
    args.out.write_text(json.dumps(result, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
