"""A lone job embedded on several cores (`semantic_cache.solo_cores`): the same vectors, sooner,
and only while nothing else runs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from gateway.cache.async_embedder import AsyncEmbedder
from gateway.cache.embedder import OnnxEmbedder, onnx_available, solo_embedder
from gateway.cache.solo import Lone, Runnable, SoloChoice
from tests.cache.test_shared_context import threads_idle
from tests.support import FakeClock

TEXTS = [
    "hi",
    "How do I negotiate a higher salary after receiving a job offer?",
    "whats the best way to ask for more money once a company already made me an offer",
    "I tried the settings menu but nothing works. What's the best way to back up my photos on "
    "my iPhone safely without paying for cloud storage? Any app you would recommend?",
    "SELECT name FROM users WHERE age < 30 ORDER BY name; -- why is this slow on 10M rows?",
    " ".join(["a long text of many words"] * 60),  # past the model's 256 tokens: cut the same
]


@pytest.mark.skipif(not onnx_available(), reason="the ONNX embedder is not installed")
def test_on_several_cores_a_text_gets_the_same_vector_bit_for_bit() -> None:
    one = OnnxEmbedder()
    two = one.on_cores(2)
    assert two.model_id == one.model_id
    for text in TEXTS:  # one at a time, as a lone job is, and all in one call
        assert np.array_equal(one.embed([text]), two.embed([text]))
    assert np.array_equal(one.embed(TEXTS), two.embed(TEXTS))


class _Recording:
    """A model that records each call's texts and sleeps `delay` in it."""

    name = "rec"
    dim = 384
    model_id = "rec"
    concurrent = True

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        time.sleep(self.delay)
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = 1.0
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def unknown_pieces(self, text: str) -> tuple[str, ...]:
        return ()

    def on_cores(self, cores: int) -> _Recording:
        return _Recording(self.delay)


class _Machine:
    """Stands in for /proc/loadavg: the runnable threads each look reads, in turn (the last one
    from then on)."""

    def __init__(self, *readings: int | None) -> None:
        self.readings = list(readings)
        self.looks = 0

    def __call__(self) -> int | None:
        self.looks += 1
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


@contextmanager
def _worker(
    machine: _Machine, delay: float = 0.0
) -> Iterator[tuple[AsyncEmbedder, _Recording, _Recording]]:
    one, solo = _Recording(delay), _Recording(delay)
    w = AsyncEmbedder([one, one], batch_max=8, queue_max=64, memo=64, solo=solo)
    assert w.solo_choice is not None
    w.solo_choice.close()
    w.solo_choice = SoloChoice(2, machine_cores=2, runnable=machine)  # a 2-core machine
    try:
        yield w, one, solo
    finally:
        w.close()


async def test_a_lone_job_on_an_idle_machine_runs_on_solo() -> None:
    machine = _Machine(1)  # this thread alone
    with _worker(machine) as (w, one, solo):
        await w.embed(["a lone question"])
        assert solo.calls == [["a lone question"]] and one.calls == []
        assert w.solo_texts == 1 and w.embedded == 1


async def test_the_event_loop_still_running_is_looked_past_once() -> None:
    # The loop that queued the job is often still running at the first look: the thread gives
    # up the GIL and looks again.
    machine = _Machine(2, 1)
    with _worker(machine) as (w, one, solo):
        await w.embed(["a lone question"])
        assert solo.calls == [["a lone question"]] and machine.looks == 2


@pytest.mark.parametrize("readings", [(2, 2), (3, 3), (None,)])
async def test_another_busy_process_or_no_loadavg_keeps_one_core(
    readings: tuple[int | None, ...],
) -> None:
    with _worker(_Machine(*readings)) as (w, one, solo):
        await w.embed(["a question"])
        assert one.calls == [["a question"]] and solo.calls == [] and w.solo_texts == 0


async def test_a_job_beside_another_runs_on_one_core() -> None:
    machine = _Machine(1)
    with _worker(machine, delay=0.05) as (w, one, solo):
        first = asyncio.create_task(w.embed(["first"]))
        for _ in range(500):  # until a thread has taken it
            if solo.calls or one.calls:
                break
            await asyncio.sleep(0.001)
        await w.embed(["second"])  # the other thread, while the first one's thread is busy
        await first
        assert solo.calls == [["first"]] and one.calls == [["second"]]


async def test_queued_jobs_and_warms_run_on_one_core() -> None:
    machine = _Machine(1)
    with _worker(machine, delay=0.01) as (w, one, solo):
        await asyncio.gather(*(w.embed([f"question {i}"]) for i in range(16)))
        # With jobs waiting, a thread's batch runs on one core: solo only where a job was
        # the last one left and the other thread idle.
        assert len(one.calls) >= 1 and sum(map(len, one.calls)) + w.solo_texts == 16
        await threads_idle(w, 2)
        solo.calls.clear()
        done = w.warm(["clause one", "clause two"], min_idle=2)
        assert done is not None and await asyncio.to_thread(done.wait, 5)
        assert solo.calls == []  # nobody waits for a warm; a lookup may arrive beside it


def test_solo_only_for_a_model_that_spreads_and_a_machine_with_the_cores() -> None:
    rec = _Recording()
    assert solo_embedder(rec, 1) is None  # solo_cores: 1 turns it off
    assert solo_embedder(object(), 2) is None  # type: ignore[arg-type]  # no on_cores
    assert solo_embedder(rec, 4096) is None  # more cores than this machine has
    if len(os.sched_getaffinity(0)) >= 2:
        assert isinstance(solo_embedder(rec, 2), _Recording)


def test_a_thread_reads_the_machines_runnable_threads() -> None:
    r = Runnable()
    try:
        seen = r()
        assert seen is None or seen >= 1  # this thread runs
    finally:
        r.close()
    assert r() is None  # closed: no reading, one core


def test_several_cores_only_while_the_machines_cores_are_free() -> None:
    machine = _Machine(1)
    choice = SoloChoice(2, machine_cores=2, runnable=machine, clock=FakeClock(100.0))
    assert choice.pick() == Lone(True, 4)  # no model call before: the longest idle band
    machine.readings = [2, 2]  # another thread stays runnable past the second look
    assert choice.pick() is None
    machine.readings = [3, 1]  # the event loop, asleep by the second look
    assert choice.pick() == Lone(False, 4)  # (learning: the two ways in turn)
    machine.readings = [None]  # no /proc/loadavg: one core
    assert choice.pick() is None
    # On 4 cores, two of them free: another thread may run beside this one.
    assert SoloChoice(2, machine_cores=4, runnable=_Machine(3, 3)).pick() is not None
    assert SoloChoice(2, machine_cores=4, runnable=_Machine(4, 4)).pick() is None


def test_the_faster_way_per_idle_band_one_lone_call_in_sixteen_probing_the_other() -> None:
    clock = FakeClock(100.0)
    choice = SoloChoice(2, machine_cores=2, runnable=_Machine(1), clock=clock)
    choice.record(None, 0.005, 60)  # a call under load: no sample, but the embedder's last

    def run(calls: int, idle_s: float, solo_s: float, one_s: float) -> list[bool]:
        ways = []
        for _ in range(calls):
            clock.t += idle_s
            lone = choice.pick()
            assert lone is not None
            ways.append(lone.solo)
            clock.t += solo_s if lone.solo else one_s
            choice.record(lone, solo_s if lone.solo else one_s, 60)
        return ways

    # Calls 1 ms apart: the first sixteen take turns; then two cores, faster (3.8 vs 4.9 ms),
    # every sixteenth probing one core.
    ways = run(160, 0.001, solo_s=0.0038, one_s=0.0049)
    assert ways[:16] == [True, False] * 8 and ways[16:].count(False) == 9
    assert choice.bands[0].samples == {True: 143, False: 17}
    # 20 ms apart the other core sleeps: two cores slower (9 ms), learnt in that band alone.
    ways = run(320, 0.020, solo_s=0.0090, one_s=0.0049)
    assert ways[-160:].count(True) == 10
    assert choice.bands[0].solo_faster() and not choice.bands[2].solo_faster()  # 6-25 ms
    ways = run(16, 0.001, solo_s=0.0038, one_s=0.0049)
    assert ways.count(True) == 15
    # The machine changes: two cores win again after idling, once the probes have seen it.
    ways = run(480, 0.020, solo_s=0.0038, one_s=0.0049)
    assert ways[-160:].count(False) == 10


def test_while_the_two_ways_are_close_one_call_in_four_probes() -> None:
    clock = FakeClock(100.0)
    choice = SoloChoice(2, machine_cores=2, runnable=_Machine(1), clock=clock)
    choice.record(None, 0.005, 60)
    ways = []
    for _ in range(16 + 64):  # learning, then 64 calls: solo 5% faster
        clock.t += 0.001
        lone = choice.pick()
        assert lone is not None
        ways.append(lone.solo)
        seconds = 0.0047 if lone.solo else 0.0049
        clock.t += seconds
        choice.record(lone, seconds, 60)
    assert choice.bands[0].near() and ways[16:].count(False) == 16
