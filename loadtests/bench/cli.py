"""Command line: ``python -m loadtests.bench <mode> --url http://127.0.0.1:8080/v1 [options]``.

Every mode shares the options of ``Common`` (target, request shape, outputs, safety); each adds its
own. Every run is bounded by its durations and by ``--max-requests`` per phase, and stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
from rich.console import Console

from . import comparison, modes, report
from .client import Client, Target, check_url, parse_target
from .procstat import parse_pids
from .progress import LiveProgress
from .prompts import RequestFactory, TokenDist
from .replay import replay as replay_mode
from .result import Bench, Result
from .schedule import Arrival

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold the API key
    no_args_is_help=True,
    help="Benchmark OpenAI-compatible endpoints (loopback only unless --allow-remote).",
)
console = Console(stderr=True)

Opt = typer.Option


@dataclass
class Common:
    """Options every mode takes."""

    url: Annotated[list[str], Opt(help="Base URL ending in /v1; repeatable as name=URL.")]
    model: Annotated[str, Opt(help="Model name sent in each request.")] = "default"
    api_key: Annotated[str | None, Opt(envvar="BENCH_API_KEY", help="Bearer key.")] = None
    prompt_tokens: Annotated[str, Opt(help="Prompt tokens: 100 | 50-200 | 10,100,1000.")] = "100"
    max_tokens: Annotated[int, Opt(help="max_tokens of each request.")] = 64
    stream: Annotated[bool, Opt(help="Stream (SSE) and measure TTFT.")] = False
    timeout: Annotated[float, Opt(help="Per-request timeout, seconds.")] = 60.0
    max_connections: Annotated[int, Opt(help="Connection pool size.")] = 1024
    max_requests: Annotated[int, Opt(help="Hard cap on requests per phase.")] = 1_000_000
    seed: Annotated[int, Opt(help="Seed for prompts and arrivals.")] = 0
    out: Annotated[Path | None, Opt(help="Directory for result.json, summary.md, PNGs.")] = None
    raw: Annotated[bool, Opt(help="Also write every request to samples.jsonl.")] = False
    plots: Annotated[bool, Opt(help="Write PNG charts with --out.")] = True
    quiet: Annotated[bool, Opt(help="No progress bar.")] = False
    allow_remote: Annotated[bool, Opt(help="Allow non-loopback URLs.")] = False
    target_header: Annotated[
        list[str],
        Opt(help="Extra header for one target, NAME=Header:value (e.g. a peer's routing headers)."),
    ] = field(default_factory=list)


_COMMON = {f.name for f in fields(Common)}


def _targets(c: Common) -> list[Target]:
    targets = [parse_target(u, c.model, c.api_key, i) for i, u in enumerate(c.url)]
    if not targets:
        raise typer.BadParameter("give at least one --url")
    extra: dict[str, list[tuple[str, str]]] = {}
    for spec in c.target_header:
        name, _, header = spec.partition("=")
        key, sep, value = header.partition(":")
        if not sep or not key.strip() or name not in {t.name for t in targets}:
            raise typer.BadParameter(f"--target-header {spec!r}: expected NAME=Header:value")
        extra.setdefault(name, []).append((key.strip(), value.strip()))
    targets = [replace(t, extra_headers=tuple(extra.get(t.name, ()))) for t in targets]
    for t in targets:
        check_url(t.url, c.allow_remote)
    return targets


def execute(
    c: Common, body: Callable[[Bench], Awaitable[Result]], targets: list[Target] | None = None
) -> Result:
    """Build the client and request factory, run ``body`` on uvloop if present, write outputs."""
    try:
        targets = targets or _targets(c)
        factory = RequestFactory(
            c.model, TokenDist.parse(c.prompt_tokens), c.max_tokens, c.stream, c.seed
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc

    async def main() -> Result:
        async with Client(c.max_connections, c.timeout) as client:
            bench = Bench(
                client,
                targets,
                factory,
                LiveProgress(not c.quiet),
                c.max_requests,
                drain_s=c.timeout,
            )
            return await body(bench)

    result = run_async(main())
    result.config = {
        "targets": {t.name: t.url for t in targets},
        "model": c.model,
        "prompt_tokens": c.prompt_tokens,
        "max_tokens": c.max_tokens,
        "stream": c.stream,
        **result.config,
    }
    show(result)
    if c.out:
        for path in report.write(result, c.out, c.raw, c.plots):
            console.print(f"wrote {path}")
    return result


def run_async(coro: Coroutine[Any, Any, Result]) -> Result:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def show(result: Result) -> None:
    """The headline figures on the terminal (the full report goes to --out)."""
    console.print(f"[bold]{result.mode}[/bold]")
    for note in result.notes:
        console.print(f"  • {note}")
    for title, rows in result.tables.items():
        console.print(f"\n[bold]{title}[/bold]")
        console.print(report.markdown_table(report._clean(rows)), markup=False, soft_wrap=True)


def command(func: Callable[..., Any]) -> Any:
    """Register a mode: its own parameters plus ``Common``'s; it returns the coroutine to run.

    Typer reads the wrapper's signature, so the annotations are resolved here (this module uses
    postponed annotations, and a hand-made signature is not evaluated by ``inspect``).
    """
    hints = {**get_type_hints(func, include_extras=True)}
    hints.update(get_type_hints(Common, include_extras=True))
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
        for p in inspect.signature(func).parameters.values()
    ]
    common = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=hints[f.name],
            default=[] if f.default is MISSING else f.default,  # --url may come from the mode
        )
        for f in fields(Common)
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        c = Common(**{k: kwargs.pop(k) for k in list(kwargs) if k in _COMMON})
        body = func(**kwargs)
        if isinstance(body, tuple):  # (body, URLs) for modes that name their own targets
            body, c.url = body
        execute(c, body)

    wrapper.__signature__ = inspect.Signature(own + common)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + common}
    return app.command(func.__name__)(wrapper)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@command
def baseline(
    repeats: Annotated[int, Opt(help="Sequential requests recorded.")] = 20,
    warmup: Annotated[int, Opt(help="Unrecorded requests first.")] = 1,
) -> Callable[[Bench], Awaitable[Result]]:
    """N sequential requests: mean, std, p50/p90/p99 of latency and TTFT."""
    return lambda b: modes.baseline(b, repeats, warmup)


@command
def stepped(
    steps: Annotated[str, Opt(help="Concurrency steps.")] = "1,2,4,8,16,32,64",
    step_seconds: Annotated[float, Opt(help="Duration of each step.")] = 10.0,
) -> Callable[[Bench], Awaitable[Result]]:
    """Closed-loop concurrency steps: throughput, latency, TTFT, errors per step."""
    return lambda b: modes.stepped(b, _ints(steps), step_seconds)


@command
def openloop(
    rate: Annotated[float, Opt(help="Requests per second.")] = 10.0,
    duration: Annotated[float, Opt(help="Seconds of sending.")] = 10.0,
    requests: Annotated[int | None, Opt(help="Stop after this many sends.")] = None,
    arrival: Annotated[str, Opt(help="poisson or constant.")] = "poisson",
    max_inflight: Annotated[int, Opt(help="Outstanding-request cap (late sends count).")] = 4096,
    window: Annotated[float, Opt(help="Timeline window, seconds.")] = 1.0,
) -> Callable[[Bench], Awaitable[Result]]:
    """Open loop at a fixed rate; latency from the scheduled send time (no coordinated omission)."""
    arr: Arrival = _arrival(arrival)
    return lambda b: modes.openloop(
        b, rate, duration, requests, arr, b.factory.seed, max_inflight, window
    )


def _arrival(text: str) -> Arrival:
    if text not in ("poisson", "constant"):
        raise typer.BadParameter("--arrival is poisson or constant")
    return text  # type: ignore[return-value]


@command
def soak(
    rate: Annotated[float, Opt(help="Requests per second.")] = 10.0,
    duration: Annotated[float, Opt(help="Seconds.")] = 600.0,
    window: Annotated[float, Opt(help="Window, seconds.")] = 10.0,
    pid: Annotated[list[str], Opt(help="Process to sample, name=PID; repeatable.")] = [],  # noqa: B006
    sample_interval: Annotated[float, Opt(help="Process sampling period, seconds.")] = 1.0,
    arrival: Annotated[str, Opt(help="poisson or constant.")] = "poisson",
    max_inflight: Annotated[int, Opt(help="Outstanding-request cap.")] = 4096,
) -> Callable[[Bench], Awaitable[Result]]:
    """Long open-loop run: per-window percentiles and errors, drift, RSS/CPU of --pid processes."""
    pids, arr = _pids(pid), _arrival(arrival)
    return lambda b: modes.soak(
        b, rate, duration, window, pids, sample_interval, arr, b.factory.seed, max_inflight
    )


def _pids(specs: list[str]) -> dict[str, int]:
    try:
        return parse_pids(specs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


@command
def coldstart(
    idle: Annotated[float, Opt(help="Idle seconds before each cold request.")] = 30.0,
    rounds: Annotated[int, Opt(help="Cold requests.")] = 3,
    warm: Annotated[int, Opt(help="Warm requests after each cold one.")] = 5,
) -> Callable[[Bench], Awaitable[Result]]:
    """First-request latency after an idle period (fresh connection) vs warm requests."""
    return lambda b: modes.coldstart(b, idle, rounds, warm)


@command
def replay(
    file: Annotated[Path, Opt(exists=True, dir_okay=False, help="JSONL traffic file.")],
    speed: Annotated[float, Opt(help="Time compression: 2 replays twice as fast.")] = 1.0,
    max_inflight: Annotated[int, Opt(help="Outstanding-request cap.")] = 4096,
) -> Callable[[Bench], Awaitable[Result]]:
    """Replay a recorded traffic file with its timing (open loop)."""
    return lambda b: replay_mode(b, file, speed, None, max_inflight)


@command
def compare(
    rounds: Annotated[int, Opt(help="Interleaved rounds.")] = 5,
    per_round: Annotated[int, Opt(help="Requests per target per round.")] = 20,
    concurrency: Annotated[int, Opt(help="Closed-loop clients within a round.")] = 1,
) -> Callable[[Bench], Awaitable[Result]]:
    """Several --url name=URL endpoints, interleaved by rounds; ratios vs the first."""
    return lambda b: comparison.compare(b, rounds, per_round, concurrency)


@command
def overhead(
    direct: Annotated[str, Opt(help="Upstream base URL, reached directly.")],
    gateway: Annotated[str, Opt(help="The same upstream through the gateway.")],
    peer: Annotated[
        list[str],
        Opt(help="Peer in front of the same upstream, [NAME=]URL; repeatable."),
    ] = [],  # noqa: B006
    rounds: Annotated[int, Opt(help="Interleaved rounds per phase.")] = 5,
    one_client_requests: Annotated[int, Opt(help="Sequential requests per target.")] = 200,
    rates: Annotated[str, Opt(help="Open-loop rates, req/s.")] = "200,500",
    rate_seconds: Annotated[float, Opt(help="Seconds per rate and target.")] = 10.0,
    concurrency: Annotated[
        str, Opt(help="Closed-loop steps for max throughput.")
    ] = "1,4,16,64,256",
    step_seconds: Annotated[float, Opt(help="Seconds per throughput step and target.")] = 3.0,
    use_wrk: Annotated[
        bool, Opt("--wrk/--no-wrk", help="Max throughput with wrk if installed.")
    ] = False,
    pid: Annotated[list[str], Opt(help="Process to meter, name=PID; repeatable.")] = [],  # noqa: B006
    arrival: Annotated[str, Opt(help="poisson or constant.")] = "poisson",
) -> tuple[Callable[[Bench], Awaitable[Result]], list[str]]:
    """Gateway overhead: direct vs through the gateway (and a peer), interleaved."""
    from . import wrk

    if use_wrk and not wrk.available():
        raise typer.BadParameter("--wrk given but wrk is not installed (apt-get install wrk)")
    plan = comparison.OverheadPlan(
        rounds=rounds,
        one_client_requests=one_client_requests,
        rates=tuple(float(r) for r in rates.split(",") if r.strip()),
        rate_s=rate_seconds,
        concurrency=tuple(_ints(concurrency)),
        step_s=step_seconds,
        arrival=_arrival(arrival),
        use_wrk=use_wrk,
    )
    pids = _pids(pid)
    peers = [p if "=" in p.split("://")[0] else f"peer{i or ''}={p}" for i, p in enumerate(peer)]
    urls = [f"direct={direct}", f"gateway={gateway}", *peers]
    return (lambda b: comparison.overhead(b, plan, pids)), urls


@command
def calibrate(
    seconds: Annotated[float, Opt(help="Seconds per step.")] = 3.0,
    steps: Annotated[str, Opt(help="Closed-loop concurrency steps.")] = "1,16,64,256",
    rates: Annotated[str, Opt(help="Open-loop rates to try, req/s.")] = "500,1000,2000,4000",
) -> tuple[Callable[[Bench], Awaitable[Result]], list[str]]:
    """How fast this generator goes: drive a trivial local server (started here) and report."""
    from .calibrate import calibrate as run
    from .calibrate import start_echo_server

    url = start_echo_server()
    return (lambda b: run(b, _ints(steps), [float(r) for r in rates.split(",")], seconds)), [url]


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        app()
