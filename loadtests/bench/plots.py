"""PNG charts of a result (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

from .result import Result, Row  # noqa: E402


def _col(rows: list[Row], key: str) -> list[float]:
    return [float(r[key]) if r.get(key) is not None else float("nan") for r in rows]


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _log2_x(ax: plt.Axes, x: list[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:g}" for v in x])


def stepped(rows: list[Row], out: Path) -> list[Path]:
    x = _col(rows, "concurrency")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, _col(rows, "req_per_s"), "o-", label="req/s")
    _log2_x(ax, x)
    ax.set_xlabel("concurrency (closed-loop clients)")
    ax.set_ylabel("requests / s")
    ax2 = ax.twinx()
    ax2.plot(x, _col(rows, "out_tok_per_s"), "s--", color="tab:orange", label="output tok/s")
    ax2.set_ylabel("output tokens / s")
    fig.legend(loc="upper left")
    ax.set_title("Throughput vs concurrency")
    paths = [_save(fig, out / "throughput_vs_concurrency.png")]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("lat_p50_ms", "lat_p90_ms", "lat_p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
        if any(key in r for r in rows):
            ax.plot(x, _col(rows, key), "o-", label=key.replace("_ms", ""))
    _log2_x(ax, x)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("ms")
    ax.legend()
    ax.set_title("Latency vs concurrency")
    return [*paths, _save(fig, out / "latency_vs_concurrency.png")]


def over_time(rows: list[Row], out: Path, title: str) -> list[Path]:
    procs = sorted({k[:-7] for r in rows for k in r if k.endswith("_rss_mb")})
    n = 2 + (1 if procs else 0)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.6 * n), sharex=True)
    t = _col(rows, "t_s")
    for key in ("lat_p50_ms", "lat_p90_ms", "lat_p99_ms"):
        axes[0].plot(t, _col(rows, key), label=key.replace("_ms", ""))
    axes[0].set_ylabel("latency ms")
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_formatter(ScalarFormatter())
    axes[0].legend()
    axes[0].set_title(title)
    axes[1].bar(
        t,
        _col(rows, "requests"),
        width=(t[1] - t[0]) * 0.8 if len(t) > 1 else 0.8,
        align="edge",
        label="requests",
    )
    axes[1].bar(
        t,
        _col(rows, "errors"),
        width=(t[1] - t[0]) * 0.8 if len(t) > 1 else 0.8,
        align="edge",
        color="tab:red",
        label="errors",
    )
    axes[1].set_ylabel("per window")
    axes[1].legend()
    if procs:
        for p in procs:
            axes[2].plot(t, _col(rows, f"{p}_rss_mb"), label=f"{p} RSS MB")
        axes[2].set_ylabel("RSS MB")
        axes[2].legend()
    axes[-1].set_xlabel("seconds")
    return [_save(fig, out / "latency_over_time.png")]


def bars(rows: list[Row], keys: tuple[str, ...], label: str, out: Path, name: str) -> Path:
    """Grouped bars: one group per row (its ``label``), one bar per key."""
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows) * len(keys) / 2), 4))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, _col(rows, key), width, label=key)
    ax.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([str(r.get(label)) for r in rows], rotation=20)
    ax.legend()
    ax.set_title(name.replace("_", " "))
    return _save(fig, out / f"{name}.png")


def plot(result: Result, out: Path) -> list[Path]:
    """The charts that suit the result's mode."""
    t = result.tables
    lat = ("lat_p50_ms", "lat_p90_ms", "lat_p99_ms")
    if result.mode == "stepped":
        return stepped(t["steps"], out)
    if result.mode in ("openloop", "replay"):
        return over_time(t["timeline"], out, f"{result.mode}: latency over time")
    if result.mode == "soak":
        return over_time(t["windows"], out, "soak: latency over time")
    if result.mode == "compare":
        return [
            bars(t["compare"], lat, "target", out, "compare_latency"),
            bars(t["compare"], ("req_per_s",), "target", out, "compare_throughput"),
        ]
    if result.mode == "overhead":
        rates = [{**r, "label": f"{r['target']}@{r['rate']:g}"} for r in t["rates"]]
        return [
            bars(t["one_client"], lat, "target", out, "overhead_one_client"),
            bars(rates, ("lat_p50_ms", "lat_p99_ms"), "label", out, "overhead_rates"),
            bars(t["max_throughput"], ("max_req_per_s",), "target", out, "overhead_max_throughput"),
        ]
    if result.mode == "calibrate":
        opened = t["open_loop"]
        return [
            *stepped(t["closed_loop"], out),
            bars(
                opened,
                ("rate", "req_per_s", "achieved_send_rate"),
                "rate",
                out,
                "calibrate_open_loop",
            ),
        ]
    if result.mode == "coldstart":
        return [bars(t["rounds"], ("cold_ms", "warm_p50_ms"), "round", out, "coldstart")]
    if result.mode == "baseline":
        return [
            bars(
                t["baseline"],
                (*lat, "ttft_p50_ms") if "ttft_p50_ms" in t["baseline"][0] else lat,
                "requests",
                out,
                "baseline",
            )
        ]
    return []
