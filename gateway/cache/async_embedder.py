"""Runs an embedder on one dedicated thread, batching whatever requests are waiting.

The event loop never runs the model: a request queues a job and awaits a future. The thread takes
every job waiting (up to `batch_max` texts), embeds their texts in one model call (a batch of 8
costs far less than 8 single calls) and resolves each future on its own loop. The queue is
bounded: when it is full the caller gets `EmbedderBusy` at once and treats the request as a cache
miss instead of waiting behind a backlog.

A job may carry a follow-up function run on the same thread with the vectors. The semantic cache
uses this so its index is only ever touched by this one thread (no locks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gateway.cache.embedder import Embedder

log = logging.getLogger(__name__)
T = TypeVar("T")


class EmbedderBusy(RuntimeError):
    """The embedding queue is full; the request should skip the semantic cache."""


@dataclass(slots=True)
class _Job:
    texts: list[str]
    then: Callable[[np.ndarray | None], Any] | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting request was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class AsyncEmbedder:
    """One worker thread owning an `Embedder` (and whatever state `then` functions touch)."""

    def __init__(self, embedder: Embedder, batch_max: int = 32, queue_max: int = 256) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.batch_max = batch_max
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_max)
        self._thread = threading.Thread(target=self._run, name="semantic-embedder", daemon=True)
        self._closed = False
        self.batches = 0
        self.embedded = 0
        self._thread.start()

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
        """Stop the thread after the jobs already queued."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _take_batch(self, first: _Job) -> tuple[list[_Job], bool]:
        batch, count, stop = [first], len(first.texts), False
        while count < self.batch_max:
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

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch, stop = self._take_batch(first)
            self._process(batch)

    def _process(self, batch: list[_Job]) -> None:
        texts = [t for job in batch for t in job.texts]
        vectors: np.ndarray | None = None
        embed_error: BaseException | None = None
        if texts:
            try:
                vectors = self.embedder.embed(texts)
                self.batches += 1
                self.embedded += len(texts)
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
                    error = embed_error
                else:
                    assert vectors is not None
                    rows = vectors[offset : offset + len(job.texts)]
                offset += len(job.texts)
            if error is None:
                try:
                    result = job.then(rows) if job.then is not None else rows
                except Exception as exc:
                    log.exception("semantic cache job failed")
                    error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
