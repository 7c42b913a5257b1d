"""Runs embedders on dedicated threads, batching whatever requests are waiting.

The event loop never runs the model: a request queues a job and awaits a future. A worker thread
takes every job waiting (up to `batch_max` texts), embeds their texts in one `embed` call (the
int8 embedder runs its model once per text inside it, so a vector never depends on its batch)
and resolves each future on its own loop. With several threads (`workers` in the settings; they
share one embedder where it allows, `make_embedders`) the model runs on several cores at once;
ONNX Runtime releases the GIL while it computes. The queue is bounded: when it is full the caller
gets `EmbedderBusy` at once and treats the request as a cache miss instead of waiting behind a
backlog.

A job may carry a follow-up function run with the vectors. The semantic cache uses this for every
index read and write; those follow-ups run under one lock, so the index still has a single writer
at a time while embeddings proceed in parallel. A follow-up that finds it needs more vectors
returns `More`: the same thread embeds them outside the lock and goes on.

A job that finds no other in flight or waiting may run on `solo`: the same model spread over
several cores (`OnnxEmbedder.on_cores`), the same vectors sooner, where `SoloChoice` finds the
machine's cores free and has measured that way faster. That is a lone request's case; under
load every job runs on one core.

Vectors of recently embedded texts are kept (`memo` texts, LRU): a question asked again verbatim in
another conversation, or looked up then stored, is embedded once. `warm` fills the memo ahead, on
a thread that would otherwise idle, with vectors a follow-up may ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gateway.cache.embedder import Embedder
from gateway.cache.solo import Lone, SoloChoice

log = logging.getLogger(__name__)
T = TypeVar("T")


class EmbedderBusy(RuntimeError):
    """The embedding queue is full; the request should skip the semantic cache."""


class JobFailed(RuntimeError):
    """A job's embedding or follow-up raised on the worker thread, which logged it there with
    its traceback (once for a whole batch); the caller counts it without logging it again.
    `__cause__` is the exception itself."""


@dataclass(slots=True)
class More:
    """What a follow-up returns when it needs more vectors: the same thread embeds `texts`
    outside the follow-ups' lock (first waiting, up to `WARM_WAIT_S`, for `after`: a `warm`
    of them in flight), then runs `then` with their vectors under it. No hop back to the event
    loop and out again between the two."""

    texts: list[str]
    then: Callable[[np.ndarray], Any]
    after: threading.Event | None = None


#: How long a `More` waits for the `warm` it depends on before embedding its texts itself.
WARM_WAIT_S = 0.05


@dataclass(slots=True)
class _Job:
    texts: list[str]
    then: Callable[[np.ndarray | None], Any] | None
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[Any] | None
    warmed: threading.Event | None = None
    """A `warm` job (no caller waits; it is embedded in a batch of its own: batched with the
    job it runs beside, it would run after it instead): set once its texts are done."""


def _failed(exc: BaseException) -> JobFailed:
    failed = JobFailed(f"{type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting request was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class AsyncEmbedder:
    """Worker threads, one per `Embedder`, sharing one queue (and the state `then` touches)."""

    def __init__(
        self,
        embedder: Embedder | Sequence[Embedder],
        batch_max: int = 32,
        queue_max: int = 256,
        memo: int = 4096,
        solo: Embedder | None = None,
        solo_cores: int = 2,
    ) -> None:
        """`solo`: the model on `solo_cores` cores, for a job alone here (`SoloChoice`)."""
        embedders = [embedder] if not isinstance(embedder, Sequence) else list(embedder)
        self.embedders = embedders
        self.embedder = embedders[0]
        self.dim = self.embedder.dim
        self.batch_max = batch_max
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_max)
        self._state = threading.Lock()  # follow-ups (index reads and writes) one at a time
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._memo_max = memo
        self._memo_lock = threading.Lock()
        self._threads = [
            threading.Thread(
                target=self._run, args=(i, e), name=f"semantic-embedder-{i}", daemon=True
            )
            for i, e in enumerate(embedders)
        ]
        self._closed = False
        self._solo = solo
        self.solo_choice = SoloChoice(solo_cores) if solo is not None else None
        self.solo_texts = 0
        """Texts embedded on `solo`."""
        # Each thread's own slot, True while it holds a job: written by that thread alone, read
        # by `idle` without a lock (a hint), so the hot path takes no lock for it.
        self._busy = [False] * len(embedders)
        self.warmed = 0
        """Texts embedded ahead by `warm`."""
        self.batches = 0
        self.embedded = 0
        self.memo_hits = 0
        for t in self._threads:
            t.start()

    @property
    def memo_bytes(self) -> int:
        return len(self._memo) * (4 * self.dim + 200)

    def remembers(self, text: str) -> bool:
        """Whether `text`'s vector is in the memo (a lookup of it would not embed)."""
        return text in self._memo  # one dict read: atomic under the GIL, a hint only

    def idle(self) -> int:
        """Threads with nothing to do now (a hint: it may change at once; read without the
        queue's lock)."""
        return self._busy.count(False) - len(self._queue.queue)

    def can_warm(self, min_idle: int = 2) -> bool:
        """Whether `warm` would queue anything now: the memo on and `min_idle` threads idle (a
        hint; check it before working out what to warm, which under load is never)."""
        return bool(self._memo_max) and not self._closed and self.idle() >= min_idle

    def warm(self, texts: list[str], min_idle: int = 2) -> threading.Event | None:
        """Embed into the memo, without waiting, those of `texts` it lacks: vectors the caller
        may soon need, computed on a thread that would otherwise idle. Only while at least
        `min_idle` threads are idle (two when the caller has a job of its own to run beside
        it); None when nothing was queued, else an event set once they are done: pass it as a
        `More`'s `after`, so that they are not embedded twice."""
        todo = [t for t in texts if t not in self._memo]
        if not todo or not self.can_warm(min_idle):
            return None
        done = threading.Event()
        try:
            self._queue.put_nowait(_Job(todo, None, None, None, done))
        except queue.Full:
            return None
        self.warmed += len(todo)
        return done

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Vectors for `texts` ((len, dim) float32, unit rows)."""
        result: np.ndarray = await self.submit(texts, None)
        return result

    async def submit(
        self,
        texts: list[str],
        then: Callable[[np.ndarray | None], T] | None,
        wait_s: float = 0.0,
    ) -> T:
        """Embed `texts` (may be empty) on the worker, then run `then(vectors)` there too.

        A full queue raises `EmbedderBusy` at once, or after waiting up to `wait_s` for room:
        back-pressure for work that must not be dropped (the caller is slowed, not refused).
        """
        if self._closed:
            raise EmbedderBusy("embedder closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job = _Job(texts, then, loop, future)
        deadline = loop.time() + wait_s
        while True:
            try:
                self._queue.put_nowait(job)
                break
            except queue.Full:
                if self._closed or loop.time() >= deadline:
                    raise EmbedderBusy("embedding queue full") from None
                await asyncio.sleep(0.002)
        return await future

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker thread (no embedding)."""
        return await self.submit([], lambda _vectors: fn())

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads after the jobs already queued."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout)
        if self.solo_choice is not None and not any(t.is_alive() for t in self._threads):
            self.solo_choice.close()  # (a thread still running might read a reused fd)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _take_batch(self, first: _Job) -> tuple[list[_Job], bool]:
        batch, count, stop = [first], len(first.texts), False
        # A job without texts goes alone, and none joins a batch: its follow-up may ask for
        # `More`, embedded one job after another on this thread while the other one idled
        # (a batch of sixteen of them, for it counts no texts: short-question p99 +40%).
        while count < self.batch_max and first.warmed is None and first.texts:
            try:  # a look at the head without the queue's lock: a hint, like `idle`
                head = self._queue.queue[0]
            except IndexError:
                break
            if head is not None and (head.warmed is not None or not head.texts):
                break  # left for another thread
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stop = True
                break
            batch.append(job)
            count += len(job.texts)
        return batch, stop

    def _run(self, slot: int, embedder: Embedder) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            self._busy[slot] = True
            try:
                batch, stop = self._take_batch(first)
                self._process(batch, embedder)
            finally:
                self._busy[slot] = False

    def _pick(self, lone: bool) -> Lone | None:
        """`SoloChoice.pick` for a job alone here (no other thread busy, none queued: hints,
        read without locks), else None. Checked before each model call: a run on `solo` that
        another job then joins shares the cores with it for one call at most."""
        choice = self.solo_choice
        if not lone or choice is None or self._busy.count(True) > 1 or self._queue.queue:
            return None
        return choice.pick()

    def _embed(self, texts: list[str], embedder: Embedder, lone: bool = True) -> np.ndarray:
        """Vectors of `texts`, from the memo where possible; on `solo` when `lone` and it is
        alone (never a `warm`'s: nobody waits for it, and a lookup may arrive beside it)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: list[int] = []
        with self._memo_lock:
            for i, text in enumerate(texts):
                vec = self._memo.get(text)
                if vec is None:
                    todo.append(i)
                else:
                    self._memo.move_to_end(text)
                    out[i] = vec
        self.memo_hits += len(texts) - len(todo)
        if todo:
            picked = self._pick(lone)
            chosen = self._solo if picked and picked.solo and self._solo else embedder
            todo_texts = [texts[i] for i in todo]
            started, done = time.perf_counter(), False
            try:
                fresh = chosen.embed(todo_texts)
                done = True
            finally:
                if self.solo_choice is not None:  # a failed call is no sample
                    self.solo_choice.record(
                        picked if done else None,
                        time.perf_counter() - started,
                        sum(map(len, todo_texts)),
                    )
            if chosen is not embedder:
                self.solo_texts += len(todo)
            self.batches += 1
            self.embedded += len(todo)
            with self._memo_lock:
                for row, i in enumerate(todo):
                    out[i] = fresh[row]
                    if self._memo_max:
                        self._memo[texts[i]] = fresh[row].copy()
                while len(self._memo) > self._memo_max:
                    self._memo.popitem(last=False)
        return out

    def _process(self, batch: list[_Job], embedder: Embedder) -> None:
        texts = [t for job in batch for t in job.texts]
        vectors: np.ndarray | None = None
        embed_error: BaseException | None = None
        if texts:
            try:
                vectors = self._embed(texts, embedder, lone=batch[0].warmed is None)
            except Exception as exc:  # resolve every waiting future, never kill the thread
                log.exception("embedding failed")
                embed_error = exc
        offset = 0
        for job in batch:
            result: Any = None
            error: BaseException | None = None
            rows = None
            if job.texts:
                if embed_error is not None:
                    error = _failed(embed_error)
                else:
                    assert vectors is not None
                    rows = vectors[offset : offset + len(job.texts)]
                offset += len(job.texts)
            if job.warmed is not None:
                job.warmed.set()
                continue
            if error is None:
                try:
                    result = self._follow(job.then, rows, embedder)
                except Exception as exc:
                    log.exception("semantic cache job failed")
                    error = _failed(exc)
            assert job.loop is not None and job.future is not None
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                job.loop.call_soon_threadsafe(_resolve, job.future, result, error)

    def _follow(
        self,
        then: Callable[[np.ndarray | None], Any] | None,
        rows: np.ndarray | None,
        embedder: Embedder,
    ) -> Any:
        """A job's follow-up under the lock, and each `More` it asks for."""
        if then is None:
            return rows
        with self._state:
            result = then(rows)
        while isinstance(result, More):
            if result.after is not None:
                result.after.wait(WARM_WAIT_S)
            more = self._embed(result.texts, embedder)
            with self._state:
                result = result.then(more)
        return result
