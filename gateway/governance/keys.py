"""Managed keys: created, rotated and revoked through the admin API; only a hash is stored.

Every process keeps all managed keys in memory (a dict by SHA-256), so authenticating a request
never waits on Redis. Changes are published on a Redis channel and applied by every replica at
once; a full resync runs every `key_refresh_s` while the channel is live, and every second while
it is not, so a new or revoked key reaches every replica within a second either way. While Redis
is down, the keys already loaded keep working. Records read from Redis are validated data (a
pydantic model, strict types, bounded numbers), never executed as configuration; one that does not
validate is skipped, logged and counted, never a failure of a listing or a change.

When Redis comes back empty (restarted without persistence), every process writes back the
records it holds that Redis lost, so processes started afterwards know them too. Processes may
hold different versions (one missed a change while it could not reach Redis): a revocation wins
over anything, else the latest change (`updated`) wins, both when a record is written back over
the one Redis holds and when a process compares Redis's version with its own. So a revoked key
is never usable again and a rotated-out secret never comes back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import time
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from gateway.governance.settings import Budget, Limits, Name
from gateway.infra.hub import Subscription
from gateway.infra.shared_state import SharedState
from gateway.infra.tasks import stop_task

log = logging.getLogger("gateway.governance")
M = TypeVar("M", bound=BaseModel)

KEY_PREFIX = "sk-gw-"
_ID = re.compile(r"^mk_[0-9a-f]{16}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# What new_secret makes: the prefix and token_urlsafe(32), 43 characters.
_SECRET = re.compile(r"^sk-gw-[A-Za-z0-9_-]{43}$")
LOOKUPS_PER_S = 20
# Unix times up to 9999-12-31 (datetime can show them); durations up to a century.
MAX_TIME = 253_402_300_799.0
MAX_DURATION_S = 100 * 365 * 86400.0
MIN_DURATION_S = 0.001
MAX_ALIASES = 1000
MAX_RECORD_BYTES = 64 * 1024  # a record is ~1 KB: anything far larger was not written by us


def _no_tiny_time(v: float) -> float:
    # 0 is "never set" (a record's `updated`); a time between 0 and 1 (5e-324 among them) is a
    # mistake, never 1970.
    if 0 < v < 1:
        raise ValueError("a Unix time in seconds is expected (0 or at least 1)")
    return v


Time = Annotated[
    float, Field(ge=0, le=MAX_TIME, allow_inf_nan=False), AfterValidator(_no_tiny_time)
]

# Writes a record back unless Redis holds one that wins (see the module docstring):
# KEYS: record, hash index entry, key index. ARGV: record JSON, id, revoked (1/0), hash-key
# prefix, channel, event, updated. Returns 1 when written.
_REPUBLISH = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and type(doc) == 'table' then
    local theirs = tonumber(doc['updated']) or 0
    if doc['revoked'] == true or (ARGV[3] ~= '1' and theirs >= tonumber(ARGV[7])) then
      redis.call('SADD', KEYS[3], ARGV[2])  -- Redis's version stays; make sure it is listed
      return 0
    end
    local old = doc['hash']
    if type(old) == 'string' and redis.call('GET', ARGV[4] .. old) == ARGV[2] then
      redis.call('DEL', ARGV[4] .. old)  -- the secret of the version replaced stops
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"""


def hash_secret(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRecord(BaseModel):
    """A managed key as stored (the hash, never the plaintext)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=_ID.pattern)
    name: str = Field(default="", max_length=200)
    tenant: Name
    hash: str = Field(pattern=_HEX64.pattern)
    created: Time
    updated: Time = 0.0
    expires_at: Time | None = None
    aliases: list[Name] = Field(
        default_factory=list, max_length=MAX_ALIASES, description="Empty = every alias."
    )
    limits: Limits = Limits()
    budget: Budget = Budget()
    revoked: bool = False

    def usable(self, now: float) -> bool:
        return not self.revoked and (self.expires_at is None or now < self.expires_at)

    def public(self) -> dict[str, Any]:
        """What the admin API shows: everything but the hash."""
        doc = self.model_dump(mode="json", exclude={"hash"})
        doc["hint"] = self.hash[:6]
        return doc


class KeyUpdate(BaseModel):
    """Fields an operator may change (PATCH); absent = unchanged."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=200)
    tenant: Name | None = None
    expires_at: Time | None = None
    aliases: list[Name] | None = Field(default=None, max_length=MAX_ALIASES)
    limits: Limits | None = None
    budget: Budget | None = None


class KeyCreate(KeyUpdate):
    tenant: Name  # type: ignore[assignment]
    expires_in_s: float | None = Field(
        default=None, ge=MIN_DURATION_S, le=MAX_DURATION_S, allow_inf_nan=False
    )


def parse_admin(model: type[M], body: bytes) -> M:
    """An admin request body: strict JSON types (no "10" for 10, no `true` for 1), bounded
    numbers, no Infinity or NaN, no member given twice (JSON parsers keep one or the other:
    which value an operator meant is unknown); raises ValidationError."""
    path = duplicate_member(body)
    if path is not None:
        raise ValidationError.from_exception_data(
            model.__name__,
            [
                {
                    "type": "value_error",
                    "loc": tuple(path),
                    "input": path[-1],
                    "ctx": {"error": ValueError(f"'{path[-1][:64]}' is given more than once")},
                }
            ],
        )
    return model.model_validate_json(body, strict=True)


class _Members(list[tuple[str, Any]]):
    """A JSON object's members in order, duplicates kept."""


def duplicate_member(body: bytes | str) -> list[str] | None:
    """The path of the first member given twice in one JSON object of `body`, else None (also
    when `body` is not JSON: its validation says so)."""
    try:
        doc = json.loads(body, object_pairs_hook=_Members)
        return _duplicate(doc, [])
    except (ValueError, RecursionError):
        return None


def _duplicate(node: Any, path: list[str]) -> list[str] | None:
    if isinstance(node, _Members):
        seen: set[str] = set()
        for k, v in node:
            if k in seen:
                return [*path, k]
            seen.add(k)
            found = _duplicate(v, [*path, k])
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found = _duplicate(v, [*path, str(i)])
            if found is not None:
                return found
    return None


class KeyStore:
    """All managed keys of the deployment, mirrored in memory."""

    def __init__(self, state: SharedState) -> None:
        self.state = state
        self._by_hash: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._synced_at = 0.0
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._misses: dict[str, float] = {}  # unknown hashes looked up recently (bounded)
        self._lookup_window = 0.0
        self._lookups = 0  # Redis lookups of unknown keys in the current second
        self.lookups_skipped = 0
        self.refresh_s = 30.0
        self.events_applied = 0
        self.malformed = 0  # records in Redis that did not validate (skipped)
        self.republished = 0  # records written back after Redis lost them
        self._malformed_logged: set[str] = set()
        self._script: Any = None
        self._stale = False  # the last full load failed: try again every second
        self.version = 0  # bumped by every change applied: running streams look again at once

    # -- Redis layout --------------------------------------------------------------------------

    def _rkey(self, key_id: str) -> str:
        return self.state.group_key("gov", "key", key_id)

    def _hkey(self, h: str) -> str:
        return self.state.group_key("gov", "keyh", h)

    @property
    def _index(self) -> str:
        return self.state.group_key("gov", "keys")

    @property
    def channel(self) -> str:
        return self.state.group_key("gov", "keys", "events")

    # -- lookups (hot path: memory only) -------------------------------------------------------

    @property
    def empty(self) -> bool:
        return not self._by_hash

    async def find(self, plaintext: str) -> KeyRecord | None:
        """The record of a presented key (usable or not), None when unknown."""
        h = hash_secret(plaintext)
        rec = self._by_hash.get(h)
        if rec is not None or not self.state.enabled:
            return rec
        # Not mirrored yet (created a moment ago on another replica?): ask Redis, at most once a
        # second per unknown key and LOOKUPS_PER_S times a second in all, and only for what has
        # the shape of a secret we make, so a flood of bad keys (each one different) cannot turn
        # into a flood of Redis calls. A key refused meanwhile arrives by the channel in
        # milliseconds and passes at the client's retry.
        now = time.monotonic()
        if now - self._misses.get(h, -10.0) < 1.0 or now - self._synced_at < 0.2:
            return None
        if not _SECRET.match(plaintext):
            return None
        if now - self._lookup_window >= 1.0:
            self._lookup_window, self._lookups = now, 0
        if self._lookups >= LOOKUPS_PER_S:
            self.lookups_skipped += 1
            return None
        self._lookups += 1
        if len(self._misses) > 10_000:
            self._misses.clear()
        self._misses[h] = now
        raw = await self.state.call(lambda r: r.get(self._hkey(h)), None)
        key_id = raw.decode() if isinstance(raw, bytes) else raw
        if key_id is not None and _ID.match(key_id):
            await self._load_one(key_id)
        rec = self._by_hash.get(h)
        return rec if rec is not None and rec.hash == h else None

    def get(self, key_id: str) -> KeyRecord | None:
        return self._by_id.get(key_id)

    def all(self) -> list[KeyRecord]:
        return sorted(self._by_id.values(), key=lambda r: r.created)

    # -- changes (admin API) -------------------------------------------------------------------

    async def create(self, spec: KeyCreate) -> tuple[KeyRecord, str]:
        """A new key: (record, plaintext). The plaintext is returned once and never stored."""
        secret = new_secret()
        now = time.time()
        expires = spec.expires_at
        if spec.expires_in_s is not None:
            expires = now + spec.expires_in_s
        rec = KeyRecord(
            id="mk_" + secrets.token_hex(8),
            name=spec.name or "",
            tenant=spec.tenant,
            hash=hash_secret(secret),
            created=now,
            updated=now,
            expires_at=expires,
            aliases=spec.aliases or [],
            limits=spec.limits or Limits(),
            budget=spec.budget or Budget(),
        )
        await self._save(rec)
        return rec, secret

    async def update(self, key_id: str, change: KeyUpdate) -> KeyRecord | None:
        rec = await self._fresh(key_id)
        if rec is None:
            return None
        # Each given field replaces the stored one as a whole (limits and budget included).
        fields = change.model_dump(exclude_unset=True)
        rec = KeyRecord.model_validate({**rec.model_dump(), **fields, "updated": time.time()})
        await self._save(rec)
        return rec

    async def rotate(self, key_id: str) -> tuple[KeyRecord, str] | None:
        """A new secret for the same key (same id, tenant, limits); the old one stops at once."""
        rec = await self._fresh(key_id)
        if rec is None or rec.revoked:
            return None
        secret = new_secret()
        rec = rec.model_copy(update={"hash": hash_secret(secret), "updated": time.time()})
        await self._save(rec)
        return rec, secret

    async def revoke(self, key_id: str) -> KeyRecord | None:
        rec = await self._fresh(key_id)
        if rec is None:
            return None
        rec = rec.model_copy(update={"revoked": True, "updated": time.time()})
        await self._save(rec)
        return rec

    async def _fresh(self, key_id: str) -> KeyRecord | None:
        if not _ID.match(key_id):
            return None
        if self.state.enabled:
            await self._load_one(key_id, strict=True)
        return self._by_id.get(key_id)

    async def _save(self, rec: KeyRecord) -> None:
        # Whatever the admin API will answer must serialise before anything is stored: a record
        # saved and then unanswerable would break listings on every replica.
        orjson.dumps(rec.public())
        if self.state.enabled:
            redis = self.state.redis
            assert redis is not None
            # Admin writes fail loudly (the caller gets a 503), unlike the request path.
            old = self._by_id.get(rec.id)
            async with redis.pipeline(transaction=True) as pipe:
                if old is not None and old.hash != rec.hash:
                    pipe.delete(self._hkey(old.hash))
                pipe.set(self._hkey(rec.hash), rec.id)
                pipe.set(self._rkey(rec.id), rec.model_dump_json())
                pipe.sadd(self._index, rec.id)
                pipe.publish(self.channel, orjson.dumps({"id": rec.id}))
                await pipe.execute()
        self._put(rec)

    def _put(self, rec: KeyRecord) -> None:
        self.version += 1
        old = self._by_id.get(rec.id)
        if old is not None:
            self._by_hash.pop(old.hash, None)
        self._by_id[rec.id] = rec
        self._by_hash[rec.hash] = rec
        self._misses.pop(rec.hash, None)

    # -- sync with the other replicas ----------------------------------------------------------

    async def _load_one(self, key_id: str, strict: bool = False) -> None:
        redis = self.state.redis
        assert redis is not None
        if strict:
            raw = await redis.get(self._rkey(key_id))
        else:
            raw = await self.state.call(lambda r: r.get(self._rkey(key_id)), None)
        if raw is None:
            return
        rec = self._parse(raw, key_id)
        if rec is not None:
            self._adopt(rec)

    def _adopt(self, rec: KeyRecord) -> None:
        """Take Redis's version of a record unless ours wins (written back at the next sync)."""
        mine = self._by_id.get(rec.id)
        if mine is None or not _wins(mine, rec):
            self._put(rec)

    async def _load_all(self) -> None:
        """Update the mirror with what Redis holds (kept as it is when Redis is down).

        A record Redis no longer holds stays: keys are revoked, never deleted, so a key missing
        from Redis means Redis lost it (restarted empty); the key keeps working here and is
        written back for the processes that start from now on.
        """

        async def read(r: Any) -> tuple[list[str], list[Any]]:
            # Index members are Redis contents too: only well-formed ids are read.
            members = await r.smembers(self._index)
            ids = sorted(i for m in members if _ID.match(i := _text(m)))
            if not ids:
                return [], []
            return ids, await r.mget([self._rkey(i) for i in ids])

        got = await self.state.call(read, None)
        self._stale = got is None
        if got is None:
            return
        recs = []
        for key_id, raw in zip(*got, strict=True):
            if raw is not None and (rec := self._parse(raw, key_id)) is not None:
                recs.append(rec)
        fresh = {r.id: r for r in recs}
        # Records Redis lost (restarted empty), and our revocations it does not hold: written
        # back, so that processes started from now on know them.
        lost = [r for r in self._by_id.values() if r.id not in fresh or _wins(r, fresh[r.id])]
        kept = {r.id: r for r in lost}
        self._by_id = {**fresh, **kept}
        self._by_hash = {r.hash: r for r in self._by_id.values()}
        self._synced_at = time.monotonic()
        if lost:
            await self._republish(lost)

    async def _republish(self, recs: list[KeyRecord]) -> None:
        async def run(r: Any) -> list[Any]:
            if self._script is None:
                self._script = r.register_script(_REPUBLISH)
            out = []
            for rec in recs:
                keys = [self._rkey(rec.id), self._hkey(rec.hash), self._index]
                args = [
                    rec.model_dump_json(),
                    rec.id,
                    "1" if rec.revoked else "0",
                    self._hkey(""),
                    self.channel,
                    orjson.dumps({"id": rec.id}),
                    repr(rec.updated),
                ]
                out.append(await self._script(keys=keys, args=args, client=r))
            return out

        written = await self.state.call(run, None)
        if written:
            n = sum(1 for w in written if w == 1)
            self.republished += n
            if n:
                log.warning("wrote %d managed key record(s) back to Redis, which had lost them", n)

    def _parse(self, raw: bytes | str, key_id: str) -> KeyRecord | None:
        """A record from Redis, or None (logged once per id, counted) when it does not validate
        or is not the record of the id it is stored under."""
        rec = None
        if len(raw) <= MAX_RECORD_BYTES:
            try:
                rec = KeyRecord.model_validate_json(raw, strict=True)
            except ValidationError:
                rec = None
        if rec is not None and rec.id == key_id:
            return rec
        self.malformed += 1
        if key_id not in self._malformed_logged and len(self._malformed_logged) < 1000:
            self._malformed_logged.add(key_id)
            log.warning("ignoring a malformed managed key record in Redis (%s)", key_id)
        return None

    async def start(self) -> None:
        if self.state.enabled:
            await self._load_all()
            # Events may have been missed while unsubscribed: a full load after each subscription.
            self._sub = self.state.hub.subscribe(
                self.channel, self._apply, on_subscribed=self._load_all
            )
            self._task = asyncio.create_task(self._sync_loop(), name="keys-sync")

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.close()
            self._sub = None
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _sync_loop(self) -> None:
        """Full resyncs, in line with the events: every `refresh_s` while the channel is live
        (an event may have been lost), every second while it is not (the process's hub
        subscribes again once Redis is back, and resyncs then too)."""
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            sub = self._sub
            if sub is None:
                return
            # A load after a re-subscription may have met Redis still marked down: again.
            if not sub.live or self._stale or time.monotonic() - last_full >= self.refresh_s:
                last_full = time.monotonic()
                sub.run_in_order(self._load_all)

    async def _apply(self, data: bytes) -> None:
        try:
            key_id = orjson.loads(data)["id"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if isinstance(key_id, str) and _ID.match(key_id):
            await self._load_one(key_id)
            self.events_applied += 1


def _wins(mine: KeyRecord, theirs: KeyRecord) -> bool:
    """Does our version of a record win over Redis's? A revocation wins, else the latest change."""
    if theirs.revoked:
        return False
    return mine.revoked or mine.updated > theirs.updated


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
