"""Write a result as JSON (``result.json``, ``samples.jsonl`` if asked) and markdown."""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from .result import Result, Row


def _clean(value: Any) -> Any:
    """NaN is not JSON: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def environment() -> dict[str, object]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def to_json(result: Result) -> dict[str, object]:
    return _clean(
        {
            "mode": result.mode,
            "config": result.config,
            "notes": result.notes,
            "tables": result.tables,
            "environment": environment(),
        }
    )  # type: ignore[return-value]


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value).replace("|", "\\|")


# Kept in result.json, left out of the markdown tables so they stay readable.
MD_HIDDEN = frozenset(
    {
        "lat_std_ms",
        "ttft_mean_ms",
        "ttft_std_ms",
        "service_p50_ms",
        "late_p50_ms",
        "wall_s",
        "lat_p90_ms_ratio",
        "added_lat_p90_ms",
        "ok",
        "out_tok_per_s_ratio",
    }
)


def markdown_table(rows: list[Row], hidden: frozenset[str] = MD_HIDDEN) -> str:
    """A GitHub markdown table over the union of the rows' keys, in first-seen order."""
    if not rows:
        return "_(no rows)_\n"
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols and k not in hidden]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_markdown(result: Result, images: list[Path] | None = None) -> str:
    parts = [f"# Benchmark: {result.mode}\n"]
    parts.append(
        "Latency and TTFT count from each request's scheduled send time; percentiles use "
        "linear interpolation (numpy's default). Times in ms.\n"
    )
    parts.append("## Configuration\n")
    parts += [f"- **{k}**: {_cell(_clean(v))}" for k, v in result.config.items()]
    if result.notes:
        parts.append("\n## Findings\n")
        parts += [f"- {n}" for n in result.notes]
    for title, rows in result.tables.items():
        parts.append(f"\n## {title}\n")
        parts.append(markdown_table(_clean(rows)))
    for img in images or []:
        parts.append(f"\n![{img.stem}]({img.name})\n")
    return "\n".join(parts)


def write(result: Result, out: Path, raw: bool = False, plots: bool = True) -> list[Path]:
    """Write every output into ``out`` (created); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "result.json"]
    written[0].write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2))
    if raw:
        path = out / "samples.jsonl"
        with path.open("wb") as f:
            for s in result.samples:
                f.write(orjson.dumps(_clean(s.row(result.t0))) + b"\n")
        written.append(path)
    images: list[Path] = []
    if plots:
        from .plots import plot

        images = plot(result, out)
    md = out / "summary.md"
    md.write_text(to_markdown(result, images))
    return [*written, md, *images]
