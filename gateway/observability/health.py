"""Readiness: the policy is loaded and at least one provider can be reached.

A background task opens (and closes) a TCP connection to every provider every
`GATEWAY_READY_PROBE_S` seconds (default 10); `/ready` only reads the cached results and the
breakers, so a readiness probe never waits on the network. A provider counts when its last
probe connected, its breaker is not open, it is not drained and its last answer was not a refusal of
its credentials or model (`upstream_auth`, cleared by its next success).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

from gateway.infra.tasks import stop_task
from gateway.resilience.breaker import BreakerState
from gateway.runtime import Runtime

log = logging.getLogger("gateway.health")


def _address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "127.0.0.1", port


class Reachability:
    """Cached TCP reachability of every provider of the running policy."""

    def __init__(
        self, runtime: Runtime, interval_s: float | None = None, timeout_s: float = 1.0
    ) -> None:
        self.runtime = runtime
        self.interval_s = interval_s or float(os.environ.get("GATEWAY_READY_PROBE_S", "10"))
        self.timeout_s = timeout_s
        self.results: dict[str, tuple[bool, float]] = {}  # provider -> (connected, when)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)

    async def _run(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self.interval_s)

    async def probe_all(self) -> None:
        providers = self.runtime.snapshot.providers
        names = list(providers)
        results = await asyncio.gather(
            *(self._probe(providers[n].config.base_url) for n in names), return_exceptions=True
        )
        now = time.monotonic()
        for name, ok in zip(names, results, strict=True):
            self.results[name] = (ok is True, now)

    async def _probe(self, base_url: str) -> bool:
        host, port = _address(base_url)
        try:
            async with asyncio.timeout(self.timeout_s):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(ready, details) from cached probes and breaker states; never touches the network."""
        snap = self.runtime.snapshot
        members: dict[str, str] = {}
        for name, p in snap.providers.items():
            probed = self.results.get(name)
            if p.drained:
                members[name] = "drained"
            elif p.auth_failed_at is not None:
                # Refused the member's key or model: not ready, however reachable it is.
                members[name] = "auth_failed"
            elif p.breaker.state is BreakerState.OPEN:
                members[name] = "breaker_open"
            elif probed is None:
                members[name] = "not_probed_yet"
            else:
                members[name] = "reachable" if probed[0] else "unreachable"
        ready = any(v == "reachable" for v in members.values())
        return ready, {"policy_version": snap.version, "providers": members}
