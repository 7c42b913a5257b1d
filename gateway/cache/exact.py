"""Exact cache: the same request (same tenant, alias and answer-changing fields) gets the same answer.

The key ignores fields that do not change the answer (`stream`, `stream_options`, `user`,
`metadata`, ...) and key order. Values are complete chat/completions JSON bodies; a streamed answer
is stored once complete and replayed as SSE when a streaming request hits.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import time
from collections import OrderedDict
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.infra.shared_state import SharedState

# Fields that never change the generated answer.
IGNORED_FIELDS = frozenset(
    {"stream", "stream_options", "user", "metadata", "store", "service_tier"}
)


# 1 MiB: a chat answer is a few KB; a large embeddings batch still fits.
DEFAULT_MAX_ENTRY_BYTES = 2**20


class ExactSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    ttl_s: int = Field(3600, ge=1)
    allow_nonzero_temperature: bool = Field(
        False,
        description="Cache sampled (temperature > 0) answers too; off = only deterministic ones.",
    )
    max_entry_bytes: int = Field(
        DEFAULT_MAX_ENTRY_BYTES,
        ge=1024,
        le=64 * 2**20,
        description="Answers larger than this are not stored (one huge answer would evict "
        "hundreds of ordinary ones, or hold a large Redis value for the whole TTL).",
    )


def cacheable(body: dict[str, Any], settings: ExactSettings) -> bool:
    """Only deterministic requests by default: temperature 0 (absent means 1 in the OpenAI API)."""
    if settings.allow_nonzero_temperature:
        return True
    t = body.get("temperature", 1)
    return isinstance(t, (int, float)) and t == 0


def exact_key(
    tenant: str,
    alias: str,
    endpoint: str,
    body: dict[str, Any],
    namespace: str = "",
    route: str = "",
) -> str:
    """`route`: where the routing decision sends the request (`route_of`): the same body sent
    to another pool (a class chosen by `x-gateway-priority`) is answered by another model."""
    fields = {k: v for k, v in body.items() if k not in IGNORED_FIELDS}
    canon = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    h = hashlib.blake2b(canon, digest_size=20)
    h.update(b"\0" + f"{tenant}\0{alias}\0{endpoint}\0{namespace}".encode())
    if route:  # left out when empty: keys of callers without a route are unchanged
        h.update(b"\0" + route.encode())
    return h.hexdigest()


# An entry is this marker, the time it was stored (Unix seconds, a big-endian double) and the
# answer: a client's `Cache-Control: max-age=N` needs the entry's age. JSON never starts with a
# NUL byte, so entries written before the marker (the answer alone) are told apart: their age is
# unknown.
_ENTRY_MARK = b"\x00gwx1"
_ENTRY_HEAD = len(_ENTRY_MARK) + 8


def pack_entry(body: bytes, stored_at: float) -> bytes:
    return _ENTRY_MARK + struct.pack(">d", stored_at) + body


def unpack_entry(raw: bytes) -> tuple[float | None, bytes]:
    """(when it was stored, or None when unknown; the answer). Entries come back from Redis,
    which other processes write: a time that is not a finite number is unknown."""
    if not raw.startswith(_ENTRY_MARK) or len(raw) < _ENTRY_HEAD:
        return None, raw
    (stored_at,) = struct.unpack(">d", raw[len(_ENTRY_MARK) : _ENTRY_HEAD])
    return (stored_at if math.isfinite(stored_at) else None), raw[_ENTRY_HEAD:]


class Store(Protocol):
    async def get(self, key: str) -> bytes | None: ...
    async def set(self, key: str, value: bytes, ttl_s: int) -> None: ...


# In-process cache size per worker (GATEWAY_EXACT_CACHE_MB): small enough that a worker stays
# within its memory budget when unique traffic fills it; with Redis the entries live there instead.
DEFAULT_MEMORY_MB = 32
# Python objects around each entry (dict slot, tuple, float, str and bytes headers), so that the
# cap bounds the memory actually used, not only the payload.
ENTRY_OVERHEAD = 200


class MemoryLRU:
    """In-process LRU bounded in bytes, with per-entry expiry."""

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is None:
            max_bytes = int(os.environ.get("GATEWAY_EXACT_CACHE_MB", DEFAULT_MEMORY_MB)) * 2**20
        self.max_bytes = max_bytes
        self.bytes = 0
        self._d: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def get(self, key: str) -> bytes | None:
        item = self._d.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            self._drop(key)
            return None
        self._d.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl_s: int) -> None:
        if len(value) > self.max_bytes:
            return
        now = time.monotonic()
        self._expire(now)
        if key in self._d:
            self._drop(key)
        # A right-sized copy: bytes from orjson.dumps keep their over-allocated buffer (~4 KB for
        # a 700-byte completion), which would make the real footprint several times the bound.
        value = memoryview(value).tobytes()
        self._d[key] = (now + ttl_s, value)
        self.bytes += len(value) + len(key) + ENTRY_OVERHEAD
        while self.bytes > self.max_bytes and self._d:
            self._drop(next(iter(self._d)))

    def _expire(self, now: float, limit: int = 8) -> None:
        """Drop a few expired entries from the least recently used end.

        Entries nobody reads again never meet `get`'s expiry check; without this, memory would
        grow to `max_bytes` under unique traffic instead of staying at what the TTLs allow.
        """
        d = self._d
        for _ in range(limit):
            if not d:
                return
            key = next(iter(d))
            if d[key][0] >= now:
                return
            self._drop(key)

    def _drop(self, key: str) -> None:
        _, v = self._d.pop(key)
        self.bytes -= len(v) + len(key) + ENTRY_OVERHEAD

    def __len__(self) -> int:
        return len(self._d)


class RedisStore:
    """Entries shared by every replica, with Redis TTLs. A Redis failure is a miss, never an error."""

    def __init__(self, state: SharedState) -> None:
        self.state = state

    async def get(self, key: str) -> bytes | None:
        k = self.state.key("exact", key)
        raw = await self.state.call(lambda r: r.get(k), None)
        return raw.encode() if isinstance(raw, str) else raw  # bytes: no decode_responses

    async def set(self, key: str, value: bytes, ttl_s: int) -> None:
        k = self.state.key("exact", key)
        await self.state.call(lambda r: r.set(k, value, ex=ttl_s), None)
