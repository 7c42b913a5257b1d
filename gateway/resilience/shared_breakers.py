"""Breaker transitions shared between gateway replicas over Redis pub/sub.

When a local breaker opens, closes or starts a Retry-After cool-down, the event is published
as ``{provider, state, until, remaining_s, reason, origin}``. Every replica subscribes and
applies the events of the others to its own breakers with ``source="remote"``; those are never
published again, so there are no echo loops. Half-open is not shared: each replica probes on
its own, and the first probe that succeeds closes the breaker everywhere.

Redis is never on the request path: the breaker listener only drops the event into a small
per-provider mailbox that a background task publishes. While Redis is unreachable the local
breakers keep working, one warning is logged, the publisher retries with backoff and the
process's `RedisHub` subscribes again once Redis is back; events raised meanwhile are coalesced
(latest per provider) and published then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from typing import Any

import orjson

from gateway.infra.hub import RedisHub, Subscription, hub_for
from gateway.resilience.breaker import BreakerEvent, BreakerRegistry, BreakerState

log = logging.getLogger(__name__)

_SHARED = (BreakerState.OPEN, BreakerState.CLOSED)
# The longest open or cool-down time a peer may report: longer is no real breaker (the
# settings cap cool-downs far below a day), so the message is ignored.
MAX_REMOTE_S = 86400.0


class SharedBreakers:
    """Bridge one process's :class:`BreakerRegistry` to the other replicas."""

    def __init__(
        self,
        registry: BreakerRegistry,
        redis: str | RedisHub,
        *,
        channel: str = "gateway:breakers",
        replica_id: str | None = None,
        reconnect_min_s: float = 0.05,
        reconnect_max_s: float = 5.0,
    ) -> None:
        self.registry = registry
        self.channel = channel
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self._min_s, self._max_s = reconnect_min_s, reconnect_max_s
        # A URL (tests, tools): a hub of its own, closed on stop; the app passes its one hub.
        self._hub_arg = redis
        self._hub: RedisHub | None = None
        self._own_hub = False
        self._sub: Subscription | None = None
        self._pending: dict[str, dict[str, Any]] = {}  # provider -> latest local event
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._down = False
        self.published = 0
        self.applied = 0
        registry.on_transition(self._on_event)

    @property
    def connected(self) -> bool:
        return self._sub is not None and self._sub.live and not self._down

    async def start(self) -> None:
        """Start the publisher and subscribe; never raises for an unreachable Redis."""
        self._hub, self._own_hub = hub_for(
            self._hub_arg, reconnect_min_s=self._min_s, reconnect_max_s=self._max_s
        )
        self._sub = self._hub.subscribe(
            self.channel, self._apply, on_subscribed=self._mark_up, on_lost=self._mark_down
        )
        self._tasks = [asyncio.create_task(self._publish_loop(), name="breakers-publish")]

    async def wait_subscribed(self, within_s: float = 5.0) -> bool:
        """For start-up and tests: True once the subscription is live."""
        return self._sub is not None and await self._sub.wait_live(within_s)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._sub is not None:
            await self._sub.close()
            self._sub = None
        if self._hub is not None and self._own_hub:
            await self._hub.aclose()
        self._hub = None

    # ---- local -> Redis --------------------------------------------------------------------

    def _on_event(self, event: BreakerEvent) -> None:
        """Breaker listener: runs on the request path, so it only fills a mailbox."""
        if event.source == "remote":
            return
        cooldown = event.old is event.new
        if not cooldown and event.new not in _SHARED:
            return
        now = time.time()
        self._pending[event.name] = {
            "provider": event.name,
            "state": "cooldown" if cooldown else event.new.value,
            "until": None if event.remaining_s is None else now + event.remaining_s,
            "reason": event.reason,
            "origin": self.replica_id,
        }
        self._wake.set()

    async def _publish_loop(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                provider, message = next(iter(self._pending.items()))
                payload = _encode(message)
                if payload is None:  # its deadline passed while Redis was away
                    self._pending.pop(provider, None)
                    continue
                try:
                    assert self._hub is not None and self._hub.client is not None
                    await self._hub.client.publish(self.channel, payload)
                except Exception as exc:  # noqa: BLE001 - whatever Redis or its client raise
                    failures += 1
                    if failures == 1:
                        continue  # maybe a pooled connection Redis dropped: once more, fresh
                    self._mark_down(exc)
                    await asyncio.sleep(self._backoff(failures))
                    continue
                failures = 0
                self.published += 1
                # Only drop it if no newer event for this provider arrived meanwhile.
                if self._pending.get(provider) is message:
                    del self._pending[provider]

    # ---- Redis -> local --------------------------------------------------------------------

    def _apply(self, data: bytes) -> None:
        try:
            msg = orjson.loads(data)
            if msg.get("origin") == self.replica_id:
                return
            provider, state = str(msg["provider"]), str(msg["state"])
            remaining = msg.get("remaining_s")
            if remaining is not None:
                remaining = float(remaining)
                if not 0.0 <= remaining <= MAX_REMOTE_S:  # NaN too
                    raise ValueError("remaining_s out of range")
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
            log.warning("ignoring malformed breaker event on %s: %r", self.channel, data[:200])
            return
        # Only providers this process has: a made-up name must not create a breaker (memory).
        breaker = self.registry.find(provider)
        if breaker is None:
            return
        if state == "cooldown":
            if remaining:
                breaker.cool_down(remaining, source="remote")
        elif state == BreakerState.OPEN.value:
            breaker.apply_remote(BreakerState.OPEN, remaining)
        elif state == BreakerState.CLOSED.value:
            breaker.apply_remote(BreakerState.CLOSED, None)
        else:
            return
        self.applied += 1

    # ---- connection health -----------------------------------------------------------------

    def _backoff(self, failures: int) -> float:
        high = min(self._max_s, self._min_s * 2 ** min(failures, 20))
        return random.uniform(high / 2, high)

    def _mark_down(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "breaker sharing: Redis unreachable (%s); local breakers only until it is back",
                exc,
            )

    def _mark_up(self) -> None:
        if self._down:
            self._down = False
            log.info("breaker sharing: Redis reachable again")
            if self._pending:
                self._wake.set()


def _encode(message: dict[str, Any]) -> bytes | None:
    """Serialise with the time left now; None when a timed event already expired."""
    until = message["until"]
    remaining = None if until is None else until - time.time()
    if remaining is not None and remaining <= 0:
        return None
    return orjson.dumps({**message, "remaining_s": remaining})
