"""Stored Responses (`store: true`): what `GET /v1/responses/{id}` returns and what
`previous_response_id` continues from.

Each record holds the Response object and the conversation so far as chat messages, under a key
that names the tenant: another tenant's id is simply not found. Records live in Redis with a TTL
when the gateway shares state (any replica can continue a conversation), else in a bounded
in-memory LRU; when Redis cannot be reached a record is kept in this process instead.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.infra.shared_state import SharedState

ID_PREFIX = "resp_"
_HEX = frozenset("0123456789abcdef")


class StoredResponses(BaseModel):
    """Policy section `responses:` (the Responses API's stored responses)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: int = Field(
        30 * 24 * 3600,
        ge=60,
        le=90 * 24 * 3600,
        description="How long a stored response can be retrieved or continued from.",
    )
    max_local: int = Field(
        10_000, ge=0, description="Records kept in memory (without Redis, or while it is down)."
    )
    max_local_bytes: int = Field(
        256 * 1024 * 1024, ge=0, description="Bytes of records kept in memory, at most."
    )
    max_record_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="A larger conversation is answered but not stored.",
    )


def new_response_id() -> str:
    return ID_PREFIX + os.urandom(24).hex()


def valid_response_id(value: Any) -> bool:
    if not isinstance(value, str) or not value.startswith(ID_PREFIX):
        return False
    rest = value[len(ID_PREFIX) :]
    return len(rest) == 48 and _HEX.issuperset(rest)


class ResponseStore:
    def __init__(
        self, state: SharedState, settings: Callable[[], StoredResponses] | None = None
    ) -> None:
        self.state = state
        default = StoredResponses.model_validate({})
        self._settings = settings or (lambda: default)  # read per call: follows policy reloads
        self._local: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._local_bytes = 0

    @property
    def settings(self) -> StoredResponses:
        return self._settings()

    def _key(self, tenant: str, response_id: str) -> str:
        return self.state.key("responses", tenant, response_id)

    async def put(self, tenant: str, response_id: str, record: dict[str, Any]) -> bool:
        """Store a record; False when it is too large to keep."""
        data = orjson.dumps(record)
        if len(data) > self.settings.max_record_bytes:
            return False
        key, ttl = self._key(tenant, response_id), self.settings.ttl_s
        if self.state.enabled:
            ok = await self.state.call(lambda r: r.set(key, data, ex=ttl), None)
            if ok:
                return True
        self._local_put(key, data, ttl)
        return True

    async def get(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        if not valid_response_id(response_id):
            return None
        key = self._key(tenant, response_id)
        data: bytes | str | None = None
        if self.state.enabled:
            data = await self.state.call(lambda r: r.get(key), None)
        if data is None:
            data = self._local_get(key)
        if data is None:
            return None
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        return doc if isinstance(doc, dict) and doc.get("tenant") == tenant else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        if not valid_response_id(response_id):
            return False
        key = self._key(tenant, response_id)
        removed = self._local_pop(key)
        if self.state.enabled:
            removed = bool(await self.state.call(lambda r: r.delete(key), 0)) or removed
        return removed

    def _local_pop(self, key: str) -> bool:
        old = self._local.pop(key, None)
        if old is not None:
            self._local_bytes -= len(old[1])
        return old is not None

    def _local_put(self, key: str, data: bytes, ttl: int) -> None:
        s = self.settings
        if s.max_local == 0 or len(data) > s.max_local_bytes:
            return
        self._local_pop(key)
        self._local[key] = (time.monotonic() + ttl, data)
        self._local_bytes += len(data)
        while len(self._local) > s.max_local or self._local_bytes > s.max_local_bytes:
            _, (_, old) = self._local.popitem(last=False)
            self._local_bytes -= len(old)

    def _local_get(self, key: str) -> bytes | None:
        hit = self._local.get(key)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            self._local_pop(key)
            return None
        return hit[1]
