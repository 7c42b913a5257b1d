"""Whether a lone model call runs on several cores.

With nothing else in flight, a job's model call can run on `cores` cores
(`OnnxEmbedder.on_cores`): the same vector, sooner, but only where those cores are free and
awake. Measured on a 2-vCPU VM (BENCHMARKS.md): a 15-token question 3.8 ms instead of 4.9 when
the machine had worked in the last few milliseconds, 7.7-9 ms after 10 ms or more of idling (the
other core asleep), and slower than one core while another process kept a core busy. So, for a
job its `AsyncEmbedder` found alone (no other thread busy, no job waiting), a call goes solo only
when

- the last model call ended under `warm_s` ago (the cores awake);
- the machine's runnable threads, this one counted, leave `cores` free (Linux's /proc/loadavg;
  looked at again after yielding the GIL, which the event loop that queued the job often still
  wants);
- and lone calls on `cores` cores have lately been faster than lone calls on one: both timed
  per character (moving averages), one lone call in `probe_every` going the other way to keep
  both figures current.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Seconds since the last model call within which the cores count as awake.
WARM_S = 0.005
#: One lone call in this many runs the other way (a probe).
PROBE_EVERY = 16
#: Weight of a new sample in the moving averages.
ALPHA = 0.1
#: Samples of each kind before the averages decide (solo until then).
MIN_SAMPLES = 8
#: Fixed cost of a call, in characters, added to its length: a short text is not cheap per
#: character.
BASE_CHARS = 40


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


class SoloChoice:
    """Decides, call by call, whether a lone job's model call runs on `cores` cores; told how
    long each call took. Used by one thread at a time per call (a hint-level race between the
    embedder's threads costs one sample, never a wrong vector: both paths compute the same)."""

    def __init__(
        self,
        cores: int,
        machine_cores: int | None = None,
        warm_s: float = WARM_S,
        probe_every: int = PROBE_EVERY,
        runnable: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cores = cores
        self.machine_cores = (
            machine_cores if machine_cores is not None else len(os.sched_getaffinity(0))
        )
        self.warm_s = warm_s
        self.probe_every = probe_every
        self._runnable = runnable if runnable is not None else Runnable()
        self._clock = clock
        self._last_end = -float("inf")
        self._lone = 0
        # Moving averages of seconds per (character + BASE_CHARS), and their sample counts.
        self.per_char = {True: 0.0, False: 0.0}
        self.samples = {True: 0, False: 0}

    def pick(self) -> bool | None:
        """For a job found alone: True to run on `cores` cores, False on one (a lone call: its
        time is a sample), None when the machine is not free or not awake (not a sample)."""
        if self._clock() - self._last_end > self.warm_s:
            return None
        free = self.machine_cores - self.cores + 1  # runnable threads that leave the cores
        running = self._runnable()
        if running is not None and running > free:
            time.sleep(0)  # give the GIL: the event loop that queued the job goes to sleep
            running = self._runnable()
        if running is None or running > free:
            return None
        self._lone += 1
        probe = self._lone % self.probe_every == 0
        return self._faster() != probe

    def _faster(self) -> bool:
        """Whether solo calls have been faster lately (yes until both kinds have samples)."""
        if min(self.samples.values()) < MIN_SAMPLES:
            return True
        return self.per_char[True] < self.per_char[False]

    def record(self, picked: bool | None, seconds: float, chars: int) -> None:
        """A model call ended, `picked` as `pick` said (None: not a lone call)."""
        self._last_end = self._clock()
        if picked is None:
            return
        sample = seconds / (chars + BASE_CHARS)
        n = self.samples[picked]
        self.per_char[picked] = (
            sample if n == 0 else (1 - ALPHA) * self.per_char[picked] + (ALPHA * sample)
        )
        self.samples[picked] = n + 1

    def close(self) -> None:
        close = getattr(self._runnable, "close", None)
        if close is not None:
            close()
