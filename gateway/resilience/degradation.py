"""When nothing can answer: degradation rules, and the deferred queue that replays requests later.

Without a rules folder in the policy, exhaustion is an honest OpenAI-shaped 502/503/504 (or a 429
when shed). With one, the first matching rule answers (marked `x-gateway-degraded`), streamed when
the request streamed, and may queue the request for replay once providers recover; the client
fetches the replayed answer by request id.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from starlette.responses import Response

from gateway.context import Context
from gateway.errors import GatewayError
from gateway.infra.hub import RedisHub, hub_for
from gateway.resilience.deferred import (
    MemoryReplayQueue,
    QueueFull,
    ReplayEntry,
    ReplayQueue,
    ReplaySettings,
    ReplayWorker,
    make_replay_queue,
)
from gateway.resilience.degrade_rules import DegradeContext, RuleStore, last_user_text, render
from gateway.wire.request import ParsedRequest

log = logging.getLogger("gateway.fallback")
SendFn = Callable[[ReplayEntry], Awaitable[tuple[int, bytes]]]


class Degradation:
    def __init__(
        self, rules_path: Path | None, redis: str | RedisHub | None, *, prefix: str = "gateway"
    ) -> None:
        """`redis`: the process's hub (the queue reads with its blocking client), or a URL
        (a hub of its own, closed on stop), or None (in memory)."""
        self.rules = RuleStore(rules_path) if rules_path is not None else None
        self._hub, self._own_hub = hub_for(redis)
        client = self._hub.blocking  # XREADGROUP ... BLOCK outlasts the request-path timeouts
        # The replicas of one deployment share the queue; other deployments use another prefix.
        self.queue: ReplayQueue = make_replay_queue(client, ReplaySettings(prefix=prefix))
        self.local_queue = MemoryReplayQueue()  # when Redis is down at enqueue time
        self.workers: list[ReplayWorker] = []
        self.degraded = 0
        self.queued = 0
        self._queue_down = False
        self._send: SendFn | None = None
        self._swaps: set[asyncio.Task[None]] = set()

    async def start(self, send: SendFn) -> None:
        self._send = send
        if self.rules is None:
            return
        await self.rules.start()
        await self._start_workers()

    async def _start_workers(self) -> None:
        if self.workers or self._send is None:
            return
        for q in {id(self.queue): self.queue, id(self.local_queue): self.local_queue}.values():
            shared = self.queue if q is self.local_queue and q is not self.queue else None
            worker = ReplayWorker(q, self._send, elsewhere=shared)
            await worker.start()
            self.workers.append(worker)

    def use_rules(self, path: Path | None) -> None:
        """A reloaded policy's rules folder, when it names another one: loaded and watched in
        the background, then swapped in (the folder's own edits reload by themselves). A folder
        that fails to load keeps the rules in force, as an edit inside the folder does."""
        current = self.rules.path if self.rules is not None else None
        if path == current:
            return
        task = asyncio.get_running_loop().create_task(self._swap(path))
        self._swaps.add(task)
        task.add_done_callback(self._swaps.discard)

    async def _swap(self, path: Path | None) -> None:
        new = RuleStore(path) if path is not None else None
        if new is not None:
            try:
                await new.start()
            except Exception as exc:  # noqa: BLE001 - a bad folder never replaces working rules
                log.error("degradation rules %s not loaded, the previous ones stay: %s", path, exc)
                return
        old, self.rules = self.rules, new
        if old is not None:
            await old.stop()
        if new is not None:
            await self._start_workers()
        log.warning("degradation rules now %s", path or "off (honest errors)")

    async def stop(self) -> None:
        for w in self.workers:
            await w.stop()
        if self.rules is not None:
            await self.rules.stop()
        if self._own_hub:
            await self._hub.aclose()

    async def degrade(
        self, err: GatewayError, acc: ParsedRequest, raw: bytes, ctx: Context
    ) -> Response:
        """The rule's answer for a request nothing could serve (or `err` itself without rules).

        Chat requests (and the Messages and Responses APIs, translated to chat) get the rule's
        answer as a chat completion; completions requests get it as a text completion, but are
        not queued (a replay runs as a chat request): under a queueing rule they get `err`.
        Embeddings have no text to degrade to: `err`.
        """
        completions = acc.endpoint == "completions"
        if self.rules is None or (acc.endpoint != "chat" and not completions):
            return err.to_response(ctx.headers())
        if completions:
            text = prompt_text(acc.body.get("prompt"))
        else:
            text = last_user_text(acc.body.get("messages"))
        rule = self.rules.match(ctx.alias, ctx.request_class, ctx.tenant, text)
        if completions and getattr(rule, "queue", False):
            return err.to_response(ctx.headers())
        retry_after = err.headers.get("retry-after")
        if getattr(rule, "queue", False):
            # The id the client fetches the answer with: generated here, unguessable, and bound
            # to the tenant (never the client's own x-request-id, which another tenant could pick).
            ctx.deferred_id = new_deferred_id()
        dctx = DegradeContext(
            ctx.alias,
            ctx.deferred_id or ctx.request_id,
            ctx.tenant,
            ctx.request_class,
            float(retry_after) if retry_after else None,
        )
        include_usage = bool((acc.body.get("stream_options") or {}).get("include_usage"))
        resp = render(rule, dctx, acc.stream, include_usage, completions)
        ctx.degraded = True
        self.degraded += 1
        headers = {
            **ctx.headers(),
            **resp.headers,
            "x-gateway-degraded": "true",
            "x-gateway-rule": rule.name,
        }
        if resp.queue:
            if await self._enqueue(acc, raw, ctx):
                headers["x-gateway-deferred"] = ctx.deferred_id or ""
            else:
                return GatewayError(
                    503,
                    "The gateway is degraded and its deferred queue is full.",
                    type="upstream_error",
                    code="deferred_queue_full",
                    headers={"retry-after": "30"},
                ).to_response(ctx.headers())
        media = headers.pop("content-type", "application/json")
        body = resp.body if resp.body is not None else b"".join(resp.chunks)
        return Response(body, status_code=resp.status, headers=headers, media_type=media)

    async def _enqueue(self, acc: ParsedRequest, raw: bytes, ctx: Context) -> bool:
        body = raw
        if acc.stream:
            plain = {k: v for k, v in acc.body.items() if k not in ("stream", "stream_options")}
            body = orjson.dumps(plain)
        for q in (self.queue, self.local_queue):
            deferred_id = ctx.deferred_id or new_deferred_id()
            try:
                await q.enqueue(deferred_id, ctx.tenant, ctx.alias, body, key_id=ctx.key_id)
            except QueueFull:
                return False
            except Exception as e:  # noqa: BLE001 - Redis down: keep it in this process instead
                if q is self.queue and await self._landed(deferred_id, ctx.tenant):
                    # Redis carried it out but its answer was lost (a timeout): queued once,
                    # there, never a second time here.
                    self.queued += 1
                    return True
                if not self._queue_down:  # once per outage, not once per request
                    self._queue_down = True
                    log.warning(
                        "deferred queue unavailable (%s); keeping requests in this process",
                        type(e).__name__,
                    )
                continue
            if q is self.queue and self._queue_down:
                self._queue_down = False
                log.warning("deferred queue reachable again")
            self.queued += 1
            return True
        return False

    async def _landed(self, deferred_id: str, tenant: str) -> bool:
        """After an enqueue that failed: is the request in the shared queue all the same?"""
        if self.queue is self.local_queue:
            return False
        try:
            async with asyncio.timeout(0.5):
                doc = await self.queue.get_result(deferred_id)
        except Exception:  # noqa: BLE001 - still unreachable: it did not land, or we cannot say
            return False
        return doc is not None and doc.get("tenant") == tenant

    async def result(self, deferred_id: str, tenant: str) -> dict | None:
        """The deferred request's state, only for the tenant that sent it (else None: not found)."""
        if not valid_deferred_id(deferred_id):
            return None
        for q in (self.queue, self.local_queue):
            try:
                doc = await q.get_result(deferred_id)
            except Exception:  # noqa: BLE001 - Redis down: look locally
                continue
            if doc is not None and doc.get("tenant") == tenant:
                return doc
        return None


def prompt_text(prompt: object) -> str:
    """The text of a completions request's prompt (its first string when a list), for rules."""
    if isinstance(prompt, list):
        prompt = next((p for p in prompt if isinstance(p, str)), "")
    return prompt if isinstance(prompt, str) else ""


DEFERRED_PREFIX = "dfr_"


def new_deferred_id() -> str:
    return DEFERRED_PREFIX + os.urandom(16).hex()


def valid_deferred_id(value: str) -> bool:
    rest = value[len(DEFERRED_PREFIX) :]
    return (
        value.startswith(DEFERRED_PREFIX)
        and len(rest) == 32
        and all(c in "0123456789abcdef" for c in rest)
    )
