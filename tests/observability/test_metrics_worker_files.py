"""The merged scrape of several workers reads the snapshot folder (PROMETHEUS_MULTIPROC_DIR):
whatever else lies there (a file of another version, a truncated or foreign one, a snapshot with
a pid of 0) is skipped, never a failed scrape (one such file made every scrape a 500)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.observability.metrics_workers import WorkerMetrics


def totals(text: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(value)
    return out


def family(value: object, labels: object = None, name: object = "demo_total") -> list[object]:
    return ["demo", "counter", "d", [[name, {"a": "x"} if labels is None else labels, value]]]


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b'"a string"',
        b'{"pid": "12", "families": []}',
        orjson.dumps({"pid": 0, "families": [family(5)]}),
        b'{"pid": -1, "families": []}',
        b'{"pid": 1.5, "families": []}',
        b'{"pid": 12}',
        b'{"pid": 12, "families": {"demo": 1}}',
        orjson.dumps({"pid": 12, "families": [["demo", "counter", "d"]]}),
        orjson.dumps({"pid": 12, "families": [["demo", "weird", "d", []]]}),
        orjson.dumps({"pid": 12, "families": [family("5")]}),
        orjson.dumps({"pid": 12, "families": [family(None)]}),
        orjson.dumps({"pid": 12, "families": [family(True)]}),
        orjson.dumps({"pid": 12, "families": [family(1, labels={"a": 1})]}),
        orjson.dumps({"pid": 12, "families": [family(1, labels=["a"])]}),
        orjson.dumps({"pid": 12, "families": [family(1, name=7)]}),
        orjson.dumps({"pid": 12, "families": [[1, "counter", "d", []]]}),
        b'{"pid": 12, "families": [',  # cut short
    ],
)
def test_a_foreign_file_in_the_folder_is_skipped(tmp_path: Path, content: bytes) -> None:
    registry = CollectorRegistry(auto_describe=True)
    Counter("demo", "d", ["a"], registry=registry).labels(a="x").inc(2)
    mine = WorkerMetrics(registry, tmp_path, 1.0)
    # Another worker's snapshot, valid: it counts.
    other = {"pid": os.getpid(), "families": [family(3)]}
    (tmp_path / "worker-other.json").write_bytes(orjson.dumps(other))
    (tmp_path / "worker-foreign.json").write_bytes(content)
    t = totals(mine.render())
    assert t['demo_total{a="x"}'] == 5.0


def test_a_snapshot_that_cannot_be_written_still_leaves_a_scrape(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=True)
    Counter("demo", "d", ["a"], registry=registry).labels(a="x").inc(2)
    mine = WorkerMetrics(registry, tmp_path, 1.0)
    mine.snapshot()
    mine.path.with_suffix(".tmp").mkdir()  # the next snapshot cannot be written
    assert totals(mine.render())['demo_total{a="x"}'] == 2.0
