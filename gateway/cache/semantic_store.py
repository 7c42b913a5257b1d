"""Redis persistence of semantic cache entries, shared by all replicas.

Each entry is one Redis string `<prefix><entry id>` with the entry's TTL, holding a small binary
record (JSON header, float32 vector, response bytes) so a restart rebuilds the index with SCAN +
MGET and no re-embedding. Every new entry is also published on a channel so the other replicas
add it to their in-memory index within milliseconds.

Redis is never allowed to fail a request: every call catches its errors, the first one is logged
(then silence until Redis works again), and Redis is skipped for `retry_s` so a dead server adds
neither latency nor connection storms. The cache then keeps working from memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import orjson

from gateway.cache.semantic_index import Entry
from gateway.infra.hub import RedisHub
from gateway.infra.redis_client import AnyRedis, is_cluster

log = logging.getLogger(__name__)

_MAGIC = b"GS1"
_HEAD = struct.Struct("<3sI")  # magic, header length


def encode_entry(entry: Entry, model_id: str, origin: str) -> bytes:
    header = orjson.dumps(
        {
            "ns": entry.namespace,
            "t": entry.text,
            "exp": entry.expires_at,
            "m": model_id,
            "d": int(entry.vector.shape[0]),
            "o": origin,
        }
    )
    vec = np.ascontiguousarray(entry.vector, dtype="<f4").tobytes()
    return b"".join((_HEAD.pack(_MAGIC, len(header)), header, vec, entry.response))


def entry_id_for(namespace: str, text: str) -> str:
    """Same question in the same namespace → same id, so replicas overwrite, not duplicate."""
    key = f"{namespace}\x00{text}".encode()
    return hashlib.blake2b(key, digest_size=16).hexdigest()


#: How far a stored vector's length may be from 1 (float32 rounding of a normalised row is ~1e-7).
_NORM_TOLERANCE = 1e-3


class InvalidEntry(ValueError):
    """A record of this model that is not what a gateway writes (tampered with, or damaged)."""


def decode_entry(entry_id: str, blob: bytes, model_id: str) -> tuple[Entry, str] | None:
    """The entry and the replica that wrote it; None for records of another model.

    Raises InvalidEntry for anything else that is not a record a gateway wrote: Redis is written
    by other processes, and an entry is served to whoever asks a similar question in its
    namespace. Its vector must be finite and of unit length (cosine is an inner product: a
    vector scaled by 1000 scored 1000 against unrelated questions and was served), its fields
    of their types and its expiry finite.
    """
    try:
        magic, hlen = _HEAD.unpack_from(blob)
        if magic != _MAGIC:
            raise InvalidEntry("not a semantic cache record")
        start = _HEAD.size
        header = orjson.loads(blob[start : start + hlen])
        if not isinstance(header, dict):
            raise InvalidEntry("header is not an object")
        if header.get("m") != model_id:
            if isinstance(header.get("m"), str):
                return None  # another embedding model's entry: not ours to use, not damaged
            raise InvalidEntry("no model id")
        ns, text, exp, dim = header.get("ns"), header.get("t"), header.get("exp"), header.get("d")
        if not isinstance(ns, str) or not isinstance(text, str):
            raise InvalidEntry("namespace or text not a string")
        if not isinstance(exp, int | float) or isinstance(exp, bool) or not math.isfinite(exp):
            raise InvalidEntry("expiry not a finite number")
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 < dim <= 65536:
            raise InvalidEntry("dimension out of range")
        vstart = start + hlen
        vend = vstart + 4 * dim
        vector = np.frombuffer(blob, dtype="<f4", count=dim, offset=vstart).astype(np.float32)
        norm = float(np.linalg.norm(vector))  # NaN or inf for a non-finite component
        if not abs(norm - 1.0) <= _NORM_TOLERANCE:
            raise InvalidEntry("vector not finite or not of unit length")
        entry = Entry(
            entry_id=entry_id,
            namespace=ns,
            text=text,
            vector=vector,
            response=bytes(blob[vend:]),
            expires_at=float(exp),
        )
        return entry, str(header.get("o", ""))
    except InvalidEntry:
        raise
    except (struct.error, ValueError, TypeError, UnicodeError) as e:
        raise InvalidEntry(f"unreadable record ({type(e).__name__})") from e


class RedisSemanticStore:
    """Writes, scans and subscribes to semantic cache entries in Redis; never raises."""

    def __init__(
        self,
        redis: AnyRedis,
        *,
        prefix: str,
        channel: str,
        model_id: str,
        origin: str,
        retry_s: float = 5.0,
        timeout_s: float = 1.0,
        hub: RedisHub | None = None,
    ) -> None:
        self._redis = redis
        self._hub = hub
        self.prefix = prefix
        self.channel = channel
        self.model_id = model_id
        self.origin = origin
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self._down_until = 0.0
        self._failing = False
        self.errors = 0
        self.invalid = 0
        """Records under the prefix that are not entries a gateway wrote (damaged, tampered
        with): never loaded into the index."""
        self._invalid_logged_at = -60.0
        self.other_model = 0
        """Records of another embedding model (a rollout of another one): skipped, not damaged."""

    # -- error handling ---------------------------------------------------------------------
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + self.retry_s
        if not self._failing:
            self._failing = True
            log.warning(
                "semantic cache: Redis %s failed (%s: %s); using memory only, retrying in %.0fs",
                what,
                type(exc).__name__,
                exc,
                self.retry_s,
            )

    def _ok(self) -> None:
        if self._failing:
            self._failing = False
            log.info("semantic cache: Redis reachable again")

    # -- writes ------------------------------------------------------------------------------
    async def put(self, entry: Entry, ttl_s: float) -> bool:
        """Persist and announce one entry; False when Redis is unavailable."""
        if not self.available():
            return False
        blob = encode_entry(entry, self.model_id, self.origin)
        try:
            px = max(1, int(ttl_s * 1000))
            message = entry.entry_id.encode() + b"\n" + blob
            if is_cluster(self._redis):
                # A cluster pipeline cannot carry PUBLISH (it goes to every node): two commands.
                async with asyncio.timeout(self.timeout_s):
                    await self._redis.set(self.prefix + entry.entry_id, blob, px=px)
                    await self._redis.publish(self.channel, message)
            else:
                async with asyncio.timeout(self.timeout_s), self._redis.pipeline(False) as pipe:
                    pipe.set(self.prefix + entry.entry_id, blob, px=px)
                    pipe.publish(self.channel, message)
                    await pipe.execute()
        except Exception as exc:
            self._failed("write", exc)
            return False
        self._ok()
        return True

    async def delete(self, entry_id: str) -> bool:
        """Remove one entry from Redis (the other replicas keep theirs until it is found
        invalid there too, or expires); False when Redis is unavailable."""
        if not self.available():
            return False
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._redis.delete(self.prefix + entry_id)
        except Exception as exc:
            self._failed("delete", exc)
            return False
        return True

    # -- rebuild -----------------------------------------------------------------------------
    async def scan(self, batch: int = 1000) -> AsyncIterator[list[Entry]]:
        """All stored entries of this model, in chunks; stops quietly on a Redis error."""
        try:
            cursor = 0
            pattern = self.prefix + "*"
            plen = len(self.prefix.encode())
            while True:
                if is_cluster(self._redis):
                    # Every primary's keys, fetched per slot (entries are spread over slots).
                    keys = [k async for k in self._redis.scan_iter(match=pattern, count=batch)]
                    cursor = 0
                    blobs = await self._redis.mget_nonatomic(keys) if keys else []
                else:
                    cursor, keys = await self._redis.scan(cursor=cursor, match=pattern, count=batch)
                    blobs = await self._redis.mget(keys) if keys else []
                if keys:
                    entries = []
                    for key, blob in zip(keys, blobs, strict=True):
                        if not isinstance(blob, bytes):  # needs decode_responses=False
                            continue
                        raw = key if isinstance(key, bytes) else str(key).encode()
                        decoded = self._decode(raw[plen:], blob)
                        if decoded is not None:
                            entries.append(decoded[0])
                    if entries:
                        yield entries
                if cursor == 0:
                    break
        except Exception as exc:
            self._failed("scan", exc)
            return
        self._ok()

    # -- pub/sub -----------------------------------------------------------------------------
    async def listen(
        self,
        on_entries: Callable[[list[Entry]], Awaitable[None]],
        on_subscribed: Callable[[], Awaitable[None]],
        ready: asyncio.Event,
    ) -> None:
        """Forward entries published by other replicas until cancelled; the hub's subscription
        loop reconnects with backoff (a hub borrowing this store's client when none was given).

        `on_subscribed` runs after each (re)subscription so entries written while this replica
        was disconnected are picked up by a rescan. `ready` is set after the first attempt.
        Entries that arrive together are forwarded in one call (one index job for all).
        """
        hub = self._hub if self._hub is not None else RedisHub(client=self._redis)
        pending: list[Entry] = []
        flushing = False

        async def flush() -> None:
            nonlocal flushing
            await asyncio.sleep(0)  # let what else is waiting arrive: one batch for all
            batch = pending[:]
            pending.clear()
            flushing = False
            if batch:
                await on_entries(batch)

        def on_message(data: bytes) -> Awaitable[None] | None:
            nonlocal flushing
            pending.extend(self._decode_messages([{"data": data}]))
            if flushing or not pending:
                return None
            flushing = True
            return flush()

        async def subscribed() -> None:
            self._ok()
            await on_subscribed()
            ready.set()

        def lost(exc: BaseException) -> None:
            self._failed("subscribe", exc)
            ready.set()

        sub = hub.subscribe(self.channel, on_message, on_subscribed=subscribed, on_lost=lost)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            await sub.close()
            if hub is not self._hub:
                await hub.aclose()

    def _decode_messages(self, msgs: list[dict]) -> list[Entry]:
        entries = []
        for msg in msgs:
            data = msg.get("data")
            if not isinstance(data, bytes | bytearray):
                continue
            entry_id, _, blob = bytes(data).partition(b"\n")
            decoded = self._decode(entry_id, blob)
            if decoded is not None and decoded[1] != self.origin:
                entries.append(decoded[0])
        return entries

    def _decode(self, entry_id: bytes, blob: bytes) -> tuple[Entry, str] | None:
        """`decode_entry`, with a record that is not a gateway's counted in `invalid` (and
        logged, at most once a minute) instead of added: never an error for the scan or the
        subscription, whatever the key or the bytes."""
        try:
            decoded = decode_entry(entry_id.decode(), blob, self.model_id)
            if decoded is None:
                self.other_model += 1
            return decoded
        except (InvalidEntry, UnicodeDecodeError) as e:
            self.invalid += 1
            now = time.monotonic()
            if now >= self._invalid_logged_at + 60:
                self._invalid_logged_at = now
                log.warning(
                    "semantic cache: record %r in Redis is not a gateway entry (%s); not loaded "
                    "(%d so far)",
                    entry_id[:64],
                    e,
                    self.invalid,
                )
            return None
