"""CPU time and resident memory of processes, read straight from /proc (Linux, no psutil)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One reading: wall time, user+system CPU seconds so far, RSS bytes."""

    t: float
    cpu_s: float
    rss_bytes: int


def read_proc(pid: int) -> ProcSample:
    """Read ``/proc/PID/stat`` (utime, stime) and ``/proc/PID/status`` (VmRSS)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name may hold spaces; fields after the closing paren are fixed.
    fields = stat[stat.rindex(b")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime are fields 14, 15
    rss = 0
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
                break
    return ProcSample(time.perf_counter(), cpu, rss)


def parse_pids(specs: list[str]) -> dict[str, int]:
    """``["gateway=123", "456"]`` → ``{"gateway": 123, "456": 456}``; checks each exists."""
    out: dict[str, int] = {}
    for spec in specs:
        name, _, pid = spec.rpartition("=")
        pid_int = int(pid)
        if not os.path.exists(f"/proc/{pid_int}"):
            raise ValueError(f"no process with pid {pid_int}")
        out[name or pid] = pid_int
    return out


@dataclass(slots=True)
class ProcDelta:
    """CPU seconds used and RSS between two readings of one process."""

    cpu_s: float
    rss_start: int
    rss_end: int

    def to_dict(self, requests: int = 0) -> dict[str, float]:
        out = {"cpu_s": self.cpu_s, "rss_start_mb": self.rss_start / 2**20}
        out["rss_end_mb"] = self.rss_end / 2**20
        if requests:
            out["cpu_ms_per_request"] = 1000 * self.cpu_s / requests
        return out


class PhaseMeter:
    """Reads named processes (always including this generator) at phase start and end."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = {"generator": os.getpid(), **pids}
        self._start: dict[str, ProcSample] = {}

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, ProcDelta]:
        end = self._read()
        return {
            n: ProcDelta(end[n].cpu_s - s.cpu_s, s.rss_bytes, end[n].rss_bytes)
            for n, s in self._start.items()
            if n in end
        }

    def _read(self) -> dict[str, ProcSample]:
        out: dict[str, ProcSample] = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                out[name] = read_proc(pid)
        return out


@dataclass(slots=True)
class Sampler:
    """Samples processes every ``interval`` seconds in the background (for soak runs)."""

    pids: dict[str, int]
    interval: float = 1.0
    series: dict[str, list[ProcSample]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    self.series.setdefault(name, []).append(read_proc(pid))
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
