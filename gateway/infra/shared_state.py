"""Shared state backend: Redis when REDIS_URL is set, otherwise nothing (everything in memory).

Redis must never take the gateway down. `SharedState.call` runs a Redis command with short
timeouts; when Redis cannot be reached it logs once, returns a default, and skips Redis for a
short back-off so a dead Redis costs requests nothing. A command Redis answers with an error is
only that command's failure (default returned), never "Redis down" for every other request.
redis-py reconnects by itself once Redis is back.

The connections themselves belong to the process's `RedisHub` (`state.hub`): its client is
`state.redis`, and every other user of Redis (subscriptions, the deferred queue, the caches)
takes its client from the same hub.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ReadOnlyError, ResponseError

from gateway.infra.hub import RedisHub
from gateway.infra.redis_client import AnyRedis

log = logging.getLogger("gateway.state")
T = TypeVar("T")


class SharedState:
    def __init__(
        self,
        url: str | None,
        *,
        prefix: str = "gw:",
        retry_after_s: float = 1.0,
        hub: RedisHub | None = None,
    ) -> None:
        """Without `hub`, the state makes its own from `url` (and closes it in `aclose`)."""
        self.url = url if hub is None else hub.url
        self.prefix = prefix
        self._retry_after_s = retry_after_s
        self._down_until = 0.0
        self._down_logged = False
        self._last_command_log = 0.0
        self._own_hub = hub is None
        # One server, a Redis Cluster or a Sentinel-managed primary, by the URL's scheme.
        self.hub = hub if hub is not None else RedisHub(url)
        self.redis: AnyRedis | None = self.hub.client

    @classmethod
    def from_env(cls) -> SharedState:
        return cls(
            os.environ.get("REDIS_URL") or None,
            prefix=os.environ.get("GATEWAY_REDIS_PREFIX", "gw:"),
        )

    @property
    def enabled(self) -> bool:
        return self.redis is not None

    @property
    def available(self) -> bool:
        return self.redis is not None and time.monotonic() >= self._down_until

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def group_key(self, group: str, *parts: str) -> str:
        """A key of `group` whose keys all share one Redis Cluster slot (the hash tag
        `{prefix+group}`): scripts and transactions may then touch several of them at once."""
        return ":".join(("{" + self.prefix + group + "}", *parts))

    def tagged_key(self, *parts: str) -> str:
        """A key prefix whose keys share one Redis Cluster slot (a hash tag), for commands and
        transactions that touch several of them together."""
        return "{" + self.key(*parts) + "}"

    def mark_down(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + self._retry_after_s
        if not self._down_logged:
            self._down_logged = True
            log.warning(
                "Redis unavailable (%s); serving with local state until it is back.",
                type(exc).__name__,
            )

    def mark_up(self) -> None:
        if self._down_logged:
            self._down_logged = False
            log.warning("Redis is back; shared state resumed.")

    async def call(self, fn: Callable[[AnyRedis], Awaitable[T]], default: T) -> T:
        """Run `fn(redis)`; on any Redis/connection error return `default` (and back off)."""
        if self.redis is None or time.monotonic() < self._down_until:
            return default
        try:
            try:
                result = await fn(self.redis)
            except RedisConnectionError:
                # A pooled connection Redis dropped (e.g. after a restart) fails once: retry on a
                # fresh one before calling Redis down.
                result = await fn(self.redis)
        except (ResponseError, DataError) as e:
            if isinstance(e, ReadOnlyError):  # a replica answering during a failover: Redis is down
                self.mark_down(e)
                return default
            # Redis answered, with an error for this command (e.g. an out-of-range argument):
            # that command failed, Redis is not down for everyone else.
            self._command_failed(e)
            return default
        except Exception as e:  # noqa: BLE001 - Redis errors, and client bugs during failovers
            self.mark_down(e)
            return default
        if self._down_logged:
            self.mark_up()
        return result

    def _command_failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_command_log >= 10.0:  # bounded: a client must not flood the log
            self._last_command_log = now
            log.warning("Redis refused a command (%s): %s", type(exc).__name__, str(exc)[:200])

    async def aclose(self) -> None:
        if self._own_hub:
            # Closing a dead connection must not fail shutdown.
            with contextlib.suppress(Exception):
                await self.hub.aclose()
