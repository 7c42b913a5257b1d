"""Deferred requests: queued while no provider can answer, replayed when one can.

A degradation rule with ``queue: true`` stores the request (a deferred id the gateway generated,
tenant, alias, body); :class:`ReplayWorker` takes queued requests, sends them through an injected
``send(entry)`` (normally the gateway's own pipeline, as the entry's tenant) and retries with backoff while that fails; the outcome is
kept under ``{prefix}:result:{request_id}`` for ``result_ttl_s`` so the client can fetch it.

With Redis the queue is a stream with a consumer group: several workers (in several replicas)
share it, an entry is acknowledged and deleted only once its result is stored, and the pending
entries of a worker that died are claimed by another (``XAUTOCLAIM``), so nothing is lost.
Without Redis a bounded in-memory queue offers the same API on one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import ResponseError

from gateway.infra.redis_client import AnyRedis
from gateway.infra.tasks import stop_task
from gateway.resilience.retry import backoff_s

log = logging.getLogger(__name__)

Body = bytes | dict[str, Any]  # the raw request body, or its parsed dict
SendFn = Callable[["ReplayEntry"], Awaitable[tuple[int, bytes]]]
_RETRY_STATUSES = frozenset({408, 429})


class ReplaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: str = Field(default="gateway", min_length=1, description="Key prefix in Redis.")
    result_ttl_s: int = Field(default=86_400, ge=1, description="How long results stay fetchable.")
    max_len: int = Field(default=10_000, ge=1, description="Queued + in-progress requests at most.")
    max_local_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="In-process queue (no Redis, or Redis down): request bodies held at most, "
        "and the same again for stored answers (the oldest answers are dropped first).",
    )
    claim_idle_ms: int = Field(
        default=30_000, ge=1, description="A held entry idle this long is orphaned."
    )
    batch: int = Field(default=10, ge=1, description="Entries read per cycle.")
    block_ms: int = Field(
        default=1_000, ge=1, description="Longest wait for new entries per cycle."
    )
    base_backoff_ms: float = Field(default=500.0, ge=0)
    max_backoff_ms: float = Field(default=30_000.0, ge=0)
    max_attempts: int = Field(default=50, ge=1, description="Then the request is failed for good.")


class QueueFull(Exception):
    """The deferred queue is at ``max_len``: answer the client with an error instead."""


@dataclass(slots=True)
class ReplayEntry:
    entry_id: str
    request_id: str
    tenant: str
    alias: str
    body: bytes
    key_id: str = ""  # the key that sent it: its limits apply to the replay too


class ReplayQueue(Protocol):
    """What the worker and the pipeline need; Redis and in-memory implement it."""

    async def enqueue(
        self, request_id: str, tenant: str, alias: str, body: Body, key_id: str = ""
    ) -> None: ...
    async def get_result(self, request_id: str) -> dict[str, Any] | None: ...
    async def set_result(self, request_id: str, doc: dict[str, Any]) -> None: ...
    async def read(self, consumer: str, count: int, block_ms: int) -> list[ReplayEntry]: ...
    async def claim_stale(
        self, consumer: str, min_idle_ms: int, count: int
    ) -> list[ReplayEntry]: ...
    async def touch(self, consumer: str, entry_ids: list[str]) -> None: ...
    async def ack(self, entry_id: str) -> None: ...
    async def depth(self) -> int: ...


def _queued_doc(request_id: str, tenant: str, alias: str) -> dict[str, Any]:
    return {
        "status": "queued",
        "request_id": request_id,
        "tenant": tenant,
        "alias": alias,
        "http_status": None,
        "body": None,
        "attempts": 0,
        "last_error": None,
        "updated_at": time.time(),
    }


class RedisReplayQueue:
    """Stream ``{prefix}:replay`` with group ``workers``; results ``{prefix}:result:{id}``."""

    GROUP = "workers"

    def __init__(self, client: AnyRedis, settings: ReplaySettings | None = None) -> None:
        self.redis = client
        self.settings = settings or ReplaySettings()
        self.stream = f"{self.settings.prefix}:replay"
        self._group_ready = False
        self.dropped = 0  # malformed entries found in the stream (never replayed)

    def result_key(self, request_id: str) -> str:
        return f"{self.settings.prefix}:result:{request_id}"

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self.redis.xgroup_create(self.stream, self.GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def _grouped(self, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run a consumer-group command; when Redis lost the group (restarted empty), recreate
        it once and run the command again: requests queued since then are then read too."""
        await self._ensure_group()
        try:
            return await op()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._group_ready = False
            log.warning("replay queue %s: consumer group gone, recreating it", self.stream)
            await self._ensure_group()
            return await op()

    async def enqueue(
        self, request_id: str, tenant: str, alias: str, body: Body, key_id: str = ""
    ) -> None:
        await self._ensure_group()
        if await self.redis.xlen(self.stream) >= self.settings.max_len:
            raise QueueFull(f"{self.stream} holds {self.settings.max_len} requests")
        doc = _queued_doc(request_id, tenant, alias)
        fields = {
            "request_id": request_id,
            "tenant": tenant,
            "key_id": key_id,
            "alias": alias,
            "body": _raw(body),
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.result_key(request_id), orjson.dumps(doc), ex=self.settings.result_ttl_s)
            pipe.xadd(self.stream, fields)  # type: ignore[arg-type]
            await pipe.execute()

    async def get_result(self, request_id: str) -> dict[str, Any] | None:
        raw = await self.redis.get(self.result_key(request_id))
        return None if raw is None else orjson.loads(raw)

    async def set_result(self, request_id: str, doc: dict[str, Any]) -> None:
        key = self.result_key(request_id)
        await self.redis.set(key, orjson.dumps(doc), ex=self.settings.result_ttl_s)

    async def read(self, consumer: str, count: int, block_ms: int) -> list[ReplayEntry]:
        reply: Any = await self._grouped(
            lambda: self.redis.xreadgroup(
                self.GROUP, consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        )
        # RESP2 answers [[stream, msgs]], RESP3 answers {stream: [msgs]}
        if isinstance(reply, dict):
            msgs = [m for batch in reply.values() for m in batch[0]] if reply else []
        else:
            msgs = [m for _, batch in reply or [] for m in batch]
        return await self._entries(msgs)

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[ReplayEntry]:
        reply: Any = await self._grouped(
            lambda: self.redis.xautoclaim(
                self.stream, self.GROUP, consumer, min_idle_ms, start_id="0-0", count=count
            )
        )
        return await self._entries(reply[1])

    async def _entries(self, msgs: list[Any]) -> list[ReplayEntry]:
        """The well-formed entries; any other is acked and deleted, one at a time, so that it
        never holds back the entries read with it (it would be read again and again)."""
        out: list[ReplayEntry] = []
        for eid, fields in msgs:
            if not fields:
                continue  # deleted since it was read
            entry = _entry(eid, fields)
            if entry is not None:
                out.append(entry)
                continue
            self.dropped += 1
            log.warning("deferred queue: dropped a malformed entry %r", _text(eid)[:64])
            await self.ack(_text(eid))
        return out

    async def touch(self, consumer: str, entry_ids: list[str]) -> None:
        if entry_ids:  # claiming to itself resets the idle time: "still working on these"
            await self._grouped(
                lambda: self.redis.xclaim(
                    self.stream, self.GROUP, consumer, 0, list[Any](entry_ids), justid=True
                )
            )

    async def ack(self, entry_id: str) -> None:
        async def ack_and_delete() -> None:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xack(self.stream, self.GROUP, entry_id)
                pipe.xdel(self.stream, entry_id)  # keeps XLEN = requests not yet done
                await pipe.execute()

        await self._grouped(ack_and_delete)

    async def depth(self) -> int:
        return int(await self.redis.xlen(self.stream))


def _raw(body: Body) -> bytes:
    return bytes(body) if isinstance(body, bytes | bytearray) else orjson.dumps(body)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# What the gateway writes: ids of these characters, short names. Anything else in the stream
# was not written by a gateway (or was damaged) and is not replayed.
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:")
_MAX_ID = 128
_MAX_NAME = 1024


def _entry(entry_id: Any, fields: dict[Any, Any]) -> ReplayEntry | None:
    """The entry, or None when it is malformed (undecodable, missing or oversized fields)."""
    try:
        f = {_text(k): v for k, v in fields.items()}
        request_id = _text(f.get("request_id", ""))
        names = [_text(f.get(k, "")) for k in ("tenant", "alias", "key_id")]
        body = f.get("body", b"")
        entry = ReplayEntry(
            entry_id=_text(entry_id),
            request_id=request_id,
            tenant=names[0],
            alias=names[1],
            body=body if isinstance(body, bytes) else str(body).encode(),
            key_id=names[2],
        )
    except (UnicodeDecodeError, ValueError, TypeError):
        return None
    if not request_id or len(request_id) > _MAX_ID or not _ID_CHARS.issuperset(request_id):
        return None
    if not names[1] or any(len(n) > _MAX_NAME for n in names):
        return None
    return entry


class MemoryReplayQueue:
    """Single-process stand-in with the same API, bounded in entries and results, and in
    bytes (request bodies held, answers stored): a burst of large requests queued during an
    outage must not grow the process without bound."""

    def __init__(
        self, settings: ReplaySettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or ReplaySettings()
        self._clock = clock
        self._ids = itertools.count(1)
        self._queue: deque[ReplayEntry] = deque()
        self._pending: dict[str, tuple[ReplayEntry, str, float]] = {}  # id -> entry, owner, since
        self._results: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._arrived = asyncio.Event()
        self.body_bytes = 0  # bodies of the queued and in-progress entries
        self.result_bytes = 0  # stored answers

    async def enqueue(
        self, request_id: str, tenant: str, alias: str, body: Body, key_id: str = ""
    ) -> None:
        if len(self._queue) + len(self._pending) >= self.settings.max_len:
            raise QueueFull(f"in-memory replay queue holds {self.settings.max_len} requests")
        raw = _raw(body)
        if self.body_bytes + len(raw) > self.settings.max_local_bytes:
            raise QueueFull(
                f"in-memory replay queue holds {self.body_bytes} bytes of requests "
                f"(max_local_bytes {self.settings.max_local_bytes})"
            )
        entry = ReplayEntry(f"{next(self._ids)}-0", request_id, tenant, alias, raw, key_id=key_id)
        await self.set_result(request_id, _queued_doc(request_id, tenant, alias))
        self._queue.append(entry)
        self.body_bytes += len(raw)
        self._arrived.set()

    async def get_result(self, request_id: str) -> dict[str, Any] | None:
        item = self._results.get(request_id)
        if item is None or item[0] <= self._clock():
            return None
        return dict(item[1])

    async def set_result(self, request_id: str, doc: dict[str, Any]) -> None:
        now = self._clock()
        replaced = self._results.pop(request_id, None)
        if replaced is not None:
            self.result_bytes -= _doc_bytes(replaced[1])
        self._results[request_id] = (now + self.settings.result_ttl_s, dict(doc))
        self.result_bytes += _doc_bytes(doc)
        # Expired first, then the oldest beyond a bound (count or bytes), so memory stays flat.
        s = self.settings
        while self._results:
            oldest_id, (expires, oldest) = next(iter(self._results.items()))
            if (
                expires > now
                and len(self._results) <= 4 * s.max_len
                and self.result_bytes <= s.max_local_bytes
            ):
                break
            del self._results[oldest_id]
            self.result_bytes -= _doc_bytes(oldest)

    async def read(self, consumer: str, count: int, block_ms: int) -> list[ReplayEntry]:
        if not self._queue:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), block_ms / 1000.0)
        out: list[ReplayEntry] = []
        while self._queue and len(out) < count:
            entry = self._queue.popleft()
            self._pending[entry.entry_id] = (entry, consumer, self._clock())
            out.append(entry)
        return out

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[ReplayEntry]:
        now, out = self._clock(), list[ReplayEntry]()
        for eid, (entry, _owner, since) in list(self._pending.items()):
            if len(out) >= count:
                break
            if (now - since) * 1000.0 >= min_idle_ms:
                self._pending[eid] = (entry, consumer, now)
                out.append(entry)
        return out

    async def touch(self, consumer: str, entry_ids: list[str]) -> None:
        now = self._clock()
        for eid in entry_ids:
            if eid in self._pending:
                self._pending[eid] = (self._pending[eid][0], consumer, now)

    async def ack(self, entry_id: str) -> None:
        held = self._pending.pop(entry_id, None)
        if held is not None:
            self.body_bytes -= len(held[0].body)

    async def depth(self) -> int:
        return len(self._queue) + len(self._pending)


def _doc_bytes(doc: dict[str, Any]) -> int:
    """About what a stored result holds: its answer, plus its small fields."""
    body = doc.get("body")
    return 256 + (len(body) if isinstance(body, str | bytes) else 0)


async def _held_elsewhere(queue: ReplayQueue, entry: ReplayEntry) -> bool:
    """Does `queue` know this request (queued, in progress or done)? False when it cannot say."""
    try:
        async with asyncio.timeout(1.0):
            doc = await queue.get_result(entry.request_id)
    except Exception:  # noqa: BLE001 - unreachable: replayed here, as the queue it was kept in
        return False
    return doc is not None and doc.get("tenant") == entry.tenant


def make_replay_queue(
    client: AnyRedis | None, settings: ReplaySettings | None = None
) -> RedisReplayQueue | MemoryReplayQueue:
    """The Redis queue when a client is configured, else the in-memory one."""
    if client is None:
        return MemoryReplayQueue(settings)
    return RedisReplayQueue(client, settings)


class ReplayWorker:
    """Takes queued requests, replays them with backoff, stores each outcome once.

    A request counts as answered when ``send`` returns a status other than 408, 429 or 5xx
    (a 2xx is stored as ``done``, another 4xx as ``failed``: replaying it again would not
    help). Exceptions and retryable statuses are retried after a jittered, doubling wait
    until ``max_attempts``. Entries being retried stay pending under this worker and are
    refreshed so that live workers never steal them; a dead worker's entries go idle and
    another worker claims them.
    """

    def __init__(
        self,
        queue: ReplayQueue,
        send: SendFn,
        consumer: str | None = None,
        settings: ReplaySettings | None = None,
        elsewhere: ReplayQueue | None = None,
    ) -> None:
        """`elsewhere`: for the in-process queue, the shared one: a request that reached it too
        (Redis timed out on the enqueue that it did carry out) is replayed from there only."""
        self.queue = queue
        self.send = send
        self.elsewhere = elsewhere
        self.consumer = consumer or f"worker-{uuid.uuid4().hex[:8]}"
        self.settings = settings or ReplaySettings()
        self._held: dict[str, tuple[ReplayEntry, int, float]] = {}  # id -> entry, tries, due
        # Entries answered but not yet stored (id -> outcome) or acknowledged (id -> None).
        self._settled: dict[str, dict[str, Any] | None] = {}
        self._last_touch = 0.0
        self._task: asyncio.Task[None] | None = None
        # Set by stop(): the loops end on it too, as a Redis client may swallow the
        # cancellation (one racing a blocking read's own timeout comes out as that timeout,
        # the read returns nothing, and the loop went on forever: stop() never returned).
        self._stopping = False
        self._down = False
        self.completed = 0

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self.run(), name=f"replay-{self.consumer}")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def run(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                await self.run_once()
                failures = 0
                if self._down:
                    self._down = False
                    log.info("replay worker %s: queue reachable again", self.consumer)
            except Exception as exc:  # noqa: BLE001 - a client bug during failover too: retry
                failures += 1
                if not self._down:
                    self._down = True
                    log.warning("replay worker %s: queue unreachable (%s)", self.consumer, exc)
                await asyncio.sleep(backoff_s(min(failures, 8), 0.1, 5.0))

    async def run_once(self) -> int:
        """One cycle: adopt orphans, take new entries, attempt what is due. Returns finished."""
        s, now = self.settings, time.monotonic()
        if now - self._last_touch >= s.claim_idle_ms / 3000.0:
            await self.queue.touch(self.consumer, list(self._held))
            self._last_touch = now
            for entry in await self.queue.claim_stale(self.consumer, s.claim_idle_ms, s.batch):
                self._held.setdefault(entry.entry_id, (entry, 0, now))
        due = [eid for eid, (_, _, at) in self._held.items() if at <= now]
        wait_ms = s.block_ms
        if self._held and not due:
            next_due = min(at for _, _, at in self._held.values())
            wait_ms = max(1, min(s.block_ms, int((next_due - now) * 1000)))
        room = max(0, s.batch - len(self._held))
        if room and not due:
            for entry in await self.queue.read(self.consumer, room, wait_ms):
                self._held[entry.entry_id] = (entry, 0, time.monotonic())
                due.append(entry.entry_id)
        elif not due:
            await asyncio.sleep(wait_ms / 1000.0)
        if not due:
            return 0
        # Due entries are replayed together: after an outage a backlog drains at the providers'
        # pace, not one request at a time (at most `batch` are held, so this stays bounded).
        # While they run (a long generation outlasts `claim_idle_ms`), the held entries are
        # refreshed, so that no other worker takes one for an orphan and replays it again.
        ending = asyncio.Event()
        keep_alive = asyncio.create_task(self._keep_alive(ending))
        try:
            # Every attempt ends before the next cycle (an error in one never leaves another
            # running while the next cycle sends its entry again).
            outcomes = await asyncio.gather(
                *(self._attempt(eid) for eid in due), return_exceptions=True
            )
        finally:
            ending.set()
            keep_alive.cancel()
            # Waited for without taking its CancelledError: a cancellation of this worker
            # arriving meanwhile must go through, never be swallowed (stop() would wait forever).
            await asyncio.wait([keep_alive])
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return sum(o for o in outcomes if isinstance(o, int))

    async def _keep_alive(self, ending: asyncio.Event) -> None:
        """Refresh the held entries every third of `claim_idle_ms` (until cancelled, or
        `ending` is set: a swallowed cancellation must not keep it going)."""
        period = self.settings.claim_idle_ms / 3000.0
        while not ending.is_set():
            await asyncio.sleep(period)
            try:
                await self.queue.touch(self.consumer, list(self._held))
            except Exception as exc:  # noqa: BLE001 - the queue is down: the next cycle says so
                log.debug("replay worker %s: refresh failed (%s)", self.consumer, exc)
                continue
            self._last_touch = time.monotonic()

    async def _attempt(self, entry_id: str) -> int:
        entry, tries, _ = self._held[entry_id]
        if entry_id in self._settled:
            # Answered already, but storing the outcome or acknowledging it failed: finish
            # that, never send the request a second time.
            return await self._finish(entry_id, entry, self._settled[entry_id])
        if tries == 0:
            # Taken for the first time here, maybe from a worker that died after storing its
            # outcome but before acknowledging it: a finished request is only acknowledged.
            known = await self.queue.get_result(entry.request_id)
            if known is not None and known.get("status") in ("done", "failed"):
                return await self._finish(entry_id, entry, None)
            if self.elsewhere is not None and await _held_elsewhere(self.elsewhere, entry):
                await self.queue.ack(entry_id)  # the shared queue has it: replayed from there
                del self._held[entry_id]
                return 0
        tries += 1
        try:
            status, body = await self.send(entry)
            error = None if status not in _RETRY_STATUSES and status < 500 else f"HTTP {status}"
        except Exception as exc:  # any failure of the replay is retried, never lost
            status, body, error = 0, b"", f"{type(exc).__name__}: {exc}"
        if error is not None and tries < self.settings.max_attempts:
            wait = backoff_s(
                tries, self.settings.base_backoff_ms / 1000.0, self.settings.max_backoff_ms / 1000.0
            )
            self._held[entry_id] = (entry, tries, time.monotonic() + wait)
            doc = _queued_doc(entry.request_id, entry.tenant, entry.alias)
            doc.update(attempts=tries, last_error=error)
            await self.queue.set_result(entry.request_id, doc)
            return 0
        doc = _queued_doc(entry.request_id, entry.tenant, entry.alias)
        doc.update(
            status="done" if 200 <= status < 300 else "failed",
            http_status=status or None,
            body=body.decode("utf-8", "replace"),
            attempts=tries,
            last_error=error,
        )
        return await self._finish(entry_id, entry, doc)

    async def _finish(self, entry_id: str, entry: ReplayEntry, doc: dict[str, Any] | None) -> int:
        """Store a finished request's outcome (None: stored already), then acknowledge it.

        Until both are done the outcome stays in `_settled`: a Redis error here retries these
        two steps on the next cycle, never the request.
        """
        self._settled[entry_id] = doc
        if doc is not None:
            await self.queue.set_result(entry.request_id, doc)  # result first, then ack
            self._settled[entry_id] = None  # stored: only the acknowledgement is left
        await self.queue.ack(entry_id)
        self._settled.pop(entry_id, None)
        del self._held[entry_id]
        self.completed += 1
        return 1
