"""The one owner of a process's Redis connections: the shared clients and every subscription.

`RedisHub(url)` makes the clients once (a single server, a Redis Cluster or a Sentinel-managed
primary, by the URL's scheme: `gateway.infra.redis_client`) and hands them to every user:

    hub.client      short timeouts, for commands on the request path (one pool for all users)
    hub.blocking    a longer socket timeout, for blocking reads (XREADGROUP ... BLOCK) and bulk
                    scans; made on first use
    hub.subscribe(channel, handler)   a subscription on the hub's one pub/sub connection

One task follows every subscription: it reconnects with capped exponential backoff and jitter,
subscribes all channels again after a reconnect, logs once per outage (not once per retry) and
stops on `aclose()`. A handler receives the message's raw bytes; one that raises is logged and
the loop goes on. Messages are data: each user validates what it receives and never applies a
message as configuration.

Without a URL the hub is disabled: `client` is None and subscriptions never go live.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.infra.redis_client import AnyRedis, make_redis
from gateway.infra.tasks import stop_task

log = logging.getLogger("gateway.redis")

Handler = Callable[[bytes], Awaitable[None] | None]
Callback = Callable[[], Awaitable[None] | None]

# Commands on the request path: fail fast, Redis must never hold a request up.
CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 0.25,
    "socket_timeout": 0.5,
    "health_check_interval": 0,
    "retry_on_timeout": False,
    "max_connections": 256,
}
# Blocking reads and bulk transfers: longer than any BLOCK the gateway asks for.
BLOCKING_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 0.5, "socket_timeout": 5.0}


class Subscription:
    """One handler on one channel. `live` while the hub's subscription to the channel is."""

    def __init__(
        self,
        hub: RedisHub,
        channel: str,
        handler: Handler,
        on_subscribed: Callback | None,
        on_lost: Callable[[BaseException], None] | None,
        queue_size: int,
    ) -> None:
        self.hub = hub
        self.channel = channel
        self.handler = handler
        self.on_subscribed = on_subscribed
        self.on_lost = on_lost
        self.received = 0
        self.dropped = 0
        self.failed = 0
        self._live = asyncio.Event()
        # What the handler returns to be awaited runs here, in arrival order, off the reader.
        self._work: asyncio.Queue[Awaitable[Any]] = asyncio.Queue(queue_size)
        self._worker: asyncio.Task[None] | None = None
        self._last_error_log = 0.0

    @property
    def live(self) -> bool:
        return self._live.is_set()

    async def wait_live(self, within_s: float = 5.0) -> bool:
        """For start-up and tests: True once the subscription is live."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._live.wait(), within_s)
        return self.live

    async def close(self) -> None:
        await self.hub.unsubscribe(self)

    def run_in_order(self, fn: Callback) -> None:
        """Run `fn` (e.g. a full resync) in line with this subscription's handlers."""
        self._run(fn, ())

    # ---- called by the hub's loop ----------------------------------------------------------

    def _went_live(self) -> None:
        self._live.set()
        if self.on_subscribed is not None:
            self._run(self.on_subscribed, ())

    def _went_down(self, exc: BaseException) -> None:
        self._live.clear()
        if self.on_lost is not None:
            try:
                self.on_lost(exc)
            except Exception:  # noqa: BLE001 - a user's callback never stops the loop
                self._log_failure("on_lost")

    def _deliver(self, data: bytes) -> None:
        self.received += 1
        self._run(self.handler, (data,))

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            result = fn(*args)
        except Exception:  # noqa: BLE001 - a raising handler is logged, the loop goes on
            self._log_failure("handler")
            return
        if not inspect.isawaitable(result):
            return
        try:
            self._work.put_nowait(result)
        except asyncio.QueueFull:
            self.dropped += 1
            if inspect.iscoroutine(result):
                result.close()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "pub/sub %s: handler falls behind, %d dropped", self.channel, self.dropped
                )
            return
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(
                self._drain(), name=f"redis-sub:{self.channel}"
            )

    async def _drain(self) -> None:
        while not self._work.empty():
            item = self._work.get_nowait()
            try:
                await item
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                self._log_failure("handler")

    def _log_failure(self, what: str) -> None:
        self.failed += 1
        now = time.monotonic()
        if now - self._last_error_log >= 10.0:  # bounded: a bad message must not flood the log
            self._last_error_log = now
            log.exception("pub/sub %s: %s failed (loop goes on)", self.channel, what)

    async def _stop(self) -> None:
        self._live.clear()
        if self._worker is not None:
            await stop_task(self._worker)
            self._worker = None
        while not self._work.empty():
            item = self._work.get_nowait()
            if inspect.iscoroutine(item):
                item.close()


class RedisHub:
    """Owns the Redis clients and the pub/sub connection of one process."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: AnyRedis | None = None,
        reconnect_min_s: float = 0.05,
        reconnect_max_s: float = 5.0,
        poll_s: float = 0.25,
        client_options: dict[str, Any] | None = None,
        blocking_options: dict[str, Any] | None = None,
    ) -> None:
        """`url` makes (and `aclose` closes) the clients; `client` borrows one made elsewhere
        (then it serves blocking reads too, and stays open)."""
        self.url = url
        self._own = client is None
        self._blocking_options = blocking_options or BLOCKING_OPTIONS
        self.client: AnyRedis | None = client
        if client is None and url:
            self.client = make_redis(url, **(client_options or CLIENT_OPTIONS))
        self._blocking: AnyRedis | None = None if self._own else client
        self._min_s, self._max_s = reconnect_min_s, reconnect_max_s
        self._poll_s = poll_s
        self._subs: dict[str, list[Subscription]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._confirmed: set[str] = set()  # channels Redis confirmed on this connection
        self._down = False
        self._closed = False
        self.reconnects = 0

    @property
    def enabled(self) -> bool:
        return self.client is not None

    @property
    def blocking(self) -> AnyRedis | None:
        """The client for blocking reads and bulk transfers (made once, on first use)."""
        if self._blocking is None and self._own and self.url:
            self._blocking = make_redis(self.url, **self._blocking_options)
        return self._blocking

    @property
    def connected(self) -> bool:
        """The pub/sub connection is up (False while no subscription was asked for)."""
        return any(s.live for subs in self._subs.values() for s in subs)

    # ---- subscriptions ---------------------------------------------------------------------

    def subscribe(
        self,
        channel: str,
        handler: Handler,
        *,
        on_subscribed: Callback | None = None,
        on_lost: Callable[[BaseException], None] | None = None,
        queue_size: int = 1024,
    ) -> Subscription:
        """Call `handler(raw bytes)` for every message on `channel`, until closed.

        `handler` runs on the reader: what it returns to be awaited runs after, in arrival order
        (at most `queue_size` waiting, then messages are dropped with a warning). `on_subscribed`
        runs after each (re)subscription (to catch up on what was missed while down); `on_lost`
        after each failed attempt or lost connection. Needs a running event loop.
        """
        sub = Subscription(self, channel, handler, on_subscribed, on_lost, queue_size)
        if self.client is None or self._closed:
            return sub
        self._subs.setdefault(channel, []).append(sub)
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis-pubsub")
        return sub

    async def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.channel, [])
        if sub in subs:
            subs.remove(sub)
            if not subs:
                del self._subs[sub.channel]
            if self._wake is not None:
                self._wake.set()
        await sub._stop()

    async def aclose(self) -> None:
        """Stop the subscription loop and close the clients this hub made."""
        self._closed = True
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        for subs in list(self._subs.values()):
            for sub in subs:
                await sub._stop()
        self._subs.clear()
        if self._own:
            for client in (self.client, self._blocking):
                if client is not None:
                    with contextlib.suppress(Exception):  # a dead connection must not fail shutdown
                        await client.aclose()
            self._blocking = None

    # ---- the one reconnect loop ------------------------------------------------------------

    async def _run(self) -> None:
        assert self.client is not None and self._wake is not None
        failures = 0
        while not self._closed:
            if not self._subs:
                self._wake.clear()
                await self._wake.wait()
                continue
            pubsub = None
            try:
                # A command first: a Redis Cluster client learns its slot map on the first one,
                # and a subscription made before cannot find the channel's node.
                await self.client.ping()
                pubsub = self.client.pubsub()
                self._confirmed = set()
                subscribed: set[str] = set()
                while self._subs or subscribed:
                    wanted = set(self._subs)
                    if wanted - subscribed:
                        await pubsub.subscribe(*sorted(wanted - subscribed))
                    if subscribed - wanted:
                        self._confirmed -= subscribed - wanted
                        await pubsub.unsubscribe(*sorted(subscribed - wanted))
                    subscribed = wanted
                    if not subscribed:
                        break
                    for channel in self._confirmed & wanted:  # a new handler on a live channel
                        for sub in self._subs.get(channel, ()):
                            if not sub.live:
                                sub._went_live()
                    self._wake.clear()
                    msg = await pubsub.get_message(timeout=self._poll_s)
                    while msg is not None:
                        if self._dispatch(msg):
                            failures = 0
                        msg = await pubsub.get_message(timeout=0)
                        if self._wake.is_set():
                            break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever Redis or its client raise
                failures += 1
                self._confirmed = set()
                self._lost(exc)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # the connection may be gone already
                        await pubsub.aclose()
            if failures:
                await asyncio.sleep(self._backoff(failures))

    def _dispatch(self, msg: dict[str, Any]) -> bool:
        """Hand one message to its subscriptions; True for a subscription confirmation."""
        kind = msg.get("type")
        raw = msg.get("channel")
        channel = raw.decode() if isinstance(raw, bytes) else str(raw)
        subs = list(self._subs.get(channel, ()))
        if kind == "subscribe":
            self._confirmed.add(channel)
            if self._down:
                self._down = False
                self.reconnects += 1
                log.warning("Redis pub/sub resumed; channels subscribed again")
            for sub in subs:
                if not sub.live:
                    sub._went_live()
            return True
        if kind == "message":
            data = msg.get("data")
            if isinstance(data, str):
                data = data.encode()
            if isinstance(data, bytes | bytearray):
                for sub in subs:
                    sub._deliver(bytes(data))
        return False

    def _lost(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "Redis pub/sub lost (%s: %s); subscribing again with backoff until it is back",
                type(exc).__name__,
                str(exc)[:200],
            )
        for subs in list(self._subs.values()):
            for sub in subs:
                sub._went_down(exc)

    def _backoff(self, failures: int) -> float:
        high = min(self._max_s, self._min_s * 2 ** min(failures, 20))
        return random.uniform(high / 2, high)


def hub_for(redis: str | RedisHub | None, **options: Any) -> tuple[RedisHub, bool]:
    """A user's hub: the one given, or (from a URL or None) its own. True when it owns it."""
    if isinstance(redis, RedisHub):
        return redis, False
    return RedisHub(redis, **options), True
