"""One scrape for all worker processes of a replica.

With `--workers N` each worker keeps its own figures (the per-request path stays a few dict
additions, no shared memory or locks). Every worker writes a snapshot of its registry to
`PROMETHEUS_MULTIPROC_DIR` every `GATEWAY_METRICS_SNAPSHOT_S` (default 1 s) and when it stops;
the worker that answers a scrape writes its own snapshot first, then reads and merges all of them:

- counters and histograms are summed over every worker that ever wrote (a worker that died keeps
  counting what it did, so totals never go back: prometheus_client's multiprocess rule);
- gauges are summed over live workers (in flight, queue depths, process memory and CPU), except
  those describing shared or per-member state, where the highest value of a live worker counts
  (breaker state: "open" is 1 if any worker has it open, so alerts written for one process hold).

Figures of other workers are at most one snapshot interval old. Metric names, labels and types
are those of a single worker: dashboards and alert rules are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gateway.infra.tasks import stop_task

log = logging.getLogger("gateway.metrics")
ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "worker-"
# Gauges where workers report the same thing (or "any worker"): the highest value counts.
MAX_GAUGES = frozenset(
    {
        "gateway_breaker_state",
        "gateway_member_latency_ewma_seconds",
        "gateway_member_drained",
        "gateway_policy_info",
        "gateway_deferred_queue_length",
        "process_start_time_seconds",
        "process_max_fds",
        "gateway_ratelimit_local_mode",
        "gateway_processes",
    }
)
# Gauges of the retry budget window are per worker: summed like in-flight counts.
_SUMMED_KINDS = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def multiproc_dir() -> Path | None:
    value = os.environ.get(ENV_DIR)
    return Path(value) if value else None


def clear(directory: Path) -> None:
    """Remove the snapshots of a previous run (the supervisor calls this before workers start)."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in directory.glob(PREFIX + "*"):
        with contextlib.suppress(OSError):
            f.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _encode(registry: CollectorRegistry) -> bytes:
    families = []
    for m in registry.collect():
        samples = [[s.name, s.labels, s.value] for s in m.samples]
        families.append([m.name, m.type, m.documentation, samples])
    return orjson.dumps({"pid": os.getpid(), "families": families})


_KINDS = frozenset(
    {"counter", "gauge", "histogram", "summary", "gaugehistogram", "info", "stateset", "unknown"}
)


def _valid(doc: object) -> bool:
    """A worker snapshot as `_encode` writes it. Anything else in the folder (a file of another
    version, a truncated or foreign one) is skipped: one such file made every scrape a 500."""
    if not isinstance(doc, dict):
        return False
    pid, families = doc.get("pid"), doc.get("families")
    if type(pid) is not int or pid <= 0 or not isinstance(families, list):
        return False
    for family in families:
        if not (isinstance(family, list) and len(family) == 4):
            return False
        name, kind, documentation, samples = family
        if not (isinstance(name, str) and kind in _KINDS and isinstance(documentation, str)):
            return False
        if not isinstance(samples, list):
            return False
        for sample in samples:
            if not (isinstance(sample, list) and len(sample) == 3):
                return False
            sname, labels, value = sample
            if not (isinstance(sname, str) and isinstance(labels, dict)):
                return False
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
                return False
            if type(value) not in (int, float):
                return False
    return True


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge(snapshots: list[dict]) -> list[Metric]:
    """Merge worker snapshots ({"pid", "live", "families"}) into metric families."""
    out: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for snap in snapshots:
        for name, kind, doc, samples in snap["families"]:
            summed = kind in _SUMMED_KINDS
            if not summed and not snap["live"]:
                continue  # a dead worker's gauges describe nothing any more
            if name not in out:
                out[name] = Metric(name, doc, kind)
                values[name] = {}
            acc = values[name]
            use_max = kind == "gauge" and name in MAX_GAUGES
            for sname, labels, value in samples:
                key = (sname, tuple(sorted(labels.items())))
                if key not in acc:
                    acc[key] = value
                elif use_max:
                    acc[key] = max(acc[key], value)
                else:
                    acc[key] += value
    for name, metric in out.items():
        for (sname, labels), value in values[name].items():
            metric.add_sample(sname, dict(labels), value)
    return list(out.values())


class WorkerMetrics:
    """This worker's snapshots, and the merged view of every worker's."""

    def __init__(self, registry: CollectorRegistry, directory: Path, interval_s: float) -> None:
        self.registry = registry
        self.directory = directory
        self.interval_s = interval_s
        self.path = directory / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_env(cls, registry: CollectorRegistry) -> WorkerMetrics | None:
        directory = multiproc_dir()
        if directory is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        interval = float(os.environ.get("GATEWAY_METRICS_SNAPSHOT_S", "1"))
        return cls(registry, directory, interval)

    def snapshot(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(_encode(self.registry))
        os.replace(tmp, self.path)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
        with contextlib.suppress(OSError):
            self.snapshot()  # the final counts stay in the totals

    async def _run(self) -> None:
        while True:
            try:
                self.snapshot()
            except OSError as e:
                log.warning("metrics snapshot not written (%s)", e)
            await asyncio.sleep(self.interval_s)

    def render(self) -> bytes:
        try:
            self.snapshot()
        except OSError as e:  # this worker's figures are then its last snapshot's
            log.warning("metrics snapshot not written (%s)", e)
        snapshots = []
        for f in sorted(self.directory.glob(PREFIX + "*.json")):
            try:
                doc = orjson.loads(f.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue  # removed or replaced meanwhile
            if not _valid(doc):
                log.warning("metrics: %s is not a worker snapshot; skipped", f.name)
                continue
            doc["live"] = f == self.path or _alive(doc["pid"])
            snapshots.append(doc)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(merge(snapshots)))
        return generate_latest(registry)
