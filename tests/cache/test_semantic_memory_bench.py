"""`loadtests/semantic_memory.py --http` runs: the memory benchmark through a real gateway."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("faiss", reason="the semantic extra is not installed")


def test_the_http_memory_benchmark_stores_every_conversation() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.semantic_memory", "--http", "--entries", "200"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    report = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    # 500 warm-up conversations, then the 200 measured: one entry and one namespace each.
    assert report["entries_stored"] == report["namespaces"] == "700"
    assert report["refused"] == "0"
    assert float(report["rss_model_mb"]) > 0
    assert out.rstrip().endswith("RSS growth within max_bytes: yes")
