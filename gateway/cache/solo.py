"""Whether a lone model call runs on several cores.

With nothing else in flight, a job's model call can run on `cores` cores
(`OnnxEmbedder.on_cores`): the same vector, sooner, but only where those cores are free and
awake. Measured on a 2-vCPU VM (BENCHMARKS.md), a 15-token question alone in a process took
3.8 ms on two cores instead of 4.9 on one when calls came every 7 ms or sooner, 5.7-9 ms after
8 ms or more of idling (the other core asleep), and more than one core's time while another
process kept a core busy. Through HTTP the gateway's and the client's own work kept the cores
awake longer. No fixed rule fits every machine and traffic, so, for a job its `AsyncEmbedder`
found alone (no other thread busy, no job waiting), the choice is measured:

- the machine's runnable threads, this one counted, must leave `cores` free (Linux's
  /proc/loadavg; looked at again after yielding the GIL, which the event loop that queued the
  job often still wants); else one core, and the call is no sample;
- lone calls are timed per character, apart by how long the embedder had idled before them (a
  few bands: a core's sleep depends on it), on `cores` cores and on one (moving averages); in
  each band the two ways take turns for the first sixteen lone calls, then the faster one runs,
  one lone call in `probe_every` the other way to keep both figures current (the cost of a
  probe that loses: one call in sixteen), one in four while the two are within a tenth of each
  other (noise in the side only probes update then misleads for fewer calls).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from typing import NamedTuple

#: One lone call in this many runs the other way (a probe).
PROBE_EVERY = 16
#: ... every this many while the two averages are close:
PROBE_CLOSE = 4
#: within this share of the larger one.
CLOSE = 0.1
#: Weight of a new sample in the moving averages.
ALPHA = 0.1
#: Samples of each way in a band before its averages decide (the two ways in turn until then).
MIN_SAMPLES = 8
#: Fixed cost of a call, in characters, added to its length: a short text is not cheap per
#: character.
BASE_CHARS = 40
#: Upper edges (seconds) of the idle bands: since the last model call ended.
IDLE_BANDS = (0.002, 0.006, 0.025, 0.1)


class Lone(NamedTuple):
    """A lone call's way (`solo`: on several cores) and its idle band."""

    solo: bool
    band: int


class Runnable:
    """Threads runnable on the machine now, the caller among them: the fourth field of Linux's
    /proc/loadavg (~2 us a read). None where it cannot be read."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/loadavg", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 64, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Band:
    __slots__ = ("lone", "per_char", "samples")

    def __init__(self) -> None:
        self.lone = 0
        # Moving averages of seconds per (character + BASE_CHARS), by way (solo or not).
        self.per_char = {True: 0.0, False: 0.0}
        self.samples = {True: 0, False: 0}

    def solo_faster(self) -> bool:
        return self.per_char[True] < self.per_char[False]

    def near(self) -> bool:
        """The two ways' averages within `CLOSE` of each other."""
        a, b = self.per_char[True], self.per_char[False]
        return abs(a - b) < CLOSE * max(a, b)


class SoloChoice:
    """Decides, call by call, whether a lone job's model call runs on `cores` cores; told how
    long each call took. The embedder's threads share it without a lock: a race costs a sample
    at most, never a wrong vector (both ways compute the same)."""

    def __init__(
        self,
        cores: int,
        machine_cores: int | None = None,
        probe_every: int = PROBE_EVERY,
        runnable: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cores = cores
        self.machine_cores = (
            machine_cores if machine_cores is not None else len(os.sched_getaffinity(0))
        )
        self.probe_every = probe_every
        self._runnable = runnable if runnable is not None else Runnable()
        self._clock = clock
        self._last_end = -float("inf")
        self.bands = [_Band() for _ in range(len(IDLE_BANDS) + 1)]

    def pick(self) -> Lone | None:
        """For a job found alone: its way and band (its time is a sample); None when the
        machine's cores are not free (one core, no sample)."""
        free = self.machine_cores - self.cores + 1  # runnable threads that leave the cores
        running = self._runnable()
        if running is not None and running > free:
            time.sleep(0)  # give the GIL: the event loop that queued the job goes to sleep
            running = self._runnable()
        if running is None or running > free:
            return None
        index = bisect.bisect_left(IDLE_BANDS, self._clock() - self._last_end)
        band = self.bands[index]
        band.lone += 1
        if min(band.samples.values()) < MIN_SAMPLES:  # learning: the two ways in turn
            return Lone(band.lone % 2 == 1, index)
        # Averages within a tenth of each other: probe every fourth call, so that noise in one
        # of them (the side that only probes update) does not keep the slower way for long.
        every = PROBE_CLOSE if band.near() else self.probe_every
        probe = band.lone % every == 0
        return Lone(band.solo_faster() != probe, index)

    def record(self, lone: Lone | None, seconds: float, chars: int) -> None:
        """A model call ended, `lone` as `pick` said (None: not a sample)."""
        self._last_end = self._clock()
        if lone is None:
            return
        band = self.bands[lone.band]
        sample = seconds / (chars + BASE_CHARS)
        n = band.samples[lone.solo]
        old = band.per_char[lone.solo]
        band.per_char[lone.solo] = sample if n == 0 else (1 - ALPHA) * old + ALPHA * sample
        band.samples[lone.solo] = n + 1

    def close(self) -> None:
        close = getattr(self._runnable, "close", None)
        if close is not None:
            close()
