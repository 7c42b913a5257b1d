"""The semantic cache as a pipeline step: when a route enables it, a similar last question in the
same context (tenant, alias, earlier turns, answer-changing parameters) is answered from the cache.

The engine (embedding model, FAISS, Redis persistence) is imported and started only when some alias
enables it, so the core gateway never loads the model. Lookups never raise; any problem is a miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.cache.exact import IGNORED_FIELDS
from gateway.cache.semantic_settings import SemanticRoute, SemanticSettings
from gateway.infra.hub import RedisHub, hub_for

if TYPE_CHECKING:
    from gateway.cache.semantic import SemanticCache

log = logging.getLogger("gateway.cache")
_NOT_PARAMS = IGNORED_FIELDS | {"messages", "model"}
#: A question is raced only where its upstream answers in more than this many lookups' time.
RACE_MARGIN = 2.0
MAX_ROUTES = 1024
_ALPHA = 0.2
#: Lookups that embed a new question seen on a route before their hit rate is trusted, and the
#: window of that rate (`race_rare_hits`): a plain mean up to it, a moving average after.
MIN_NEW = 20
NEW_WINDOW = 50


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + _ALPHA * (sample - old)


@dataclass(slots=True)
class _HitRate:
    """Share of a route's lookups of new questions (not in the vector memo) that found an answer."""

    seen: int = 0
    rate: float = 0.0

    def add(self, hit: bool) -> None:
        self.seen += 1
        self.rate += (float(hit) - self.rate) / min(self.seen, NEW_WINDOW)


@dataclass(slots=True)
class SemanticPlan:
    namespace: str
    text: str
    threshold: float | None
    ttl_s: float | None
    vector: Any = None
    refresh: bool = False
    streamed: bool = False
    """The client asked for a stream: raced against its upstream's first chunk, timed apart."""
    route: str = ""
    """Where the routing decision sends it: its upstream's answer time is kept per route."""
    race_all: bool = False
    """The alias races every lookup, not only unrelated questions' (`SemanticRoute.race_all`)."""
    pending: Any = None
    hit_id: str | None = None
    """The entry the lookup served (to drop it when it is not a valid answer)."""
    """The lookup still running after the budget ran out (its vector serves the store)."""
    """Cache-Control: no-cache: the answer replaces the entry, its store applies back-pressure."""


class SemanticLayer:
    def __init__(
        self, settings: SemanticSettings, redis: str | RedisHub | None, prefix: str
    ) -> None:
        """`redis`: the process's hub, or a URL (a hub of its own, closed in `aclose`)."""
        self.settings = settings.model_copy(
            update={"redis_prefix": f"{prefix}sem:", "redis_channel": f"{prefix}sem:new"}
        )
        self._redis_arg = redis
        self.redis_url = redis.url if isinstance(redis, RedisHub) else redis
        self._hub: RedisHub | None = None
        self._own_hub = False
        self.cache: SemanticCache | None = None
        self.hits = 0
        self.misses = 0
        self.rejected: dict[str, int] = {}
        self._stores: set[asyncio.Task[bool]] = set()
        self.skipped: dict[str, int] = {}
        """Answers the cache stage did not store, by reason (counted as refused stores)."""
        self.late = 0
        """Lookups that outlasted `lookup_budget_ms` (the upstream call started meanwhile)."""
        self.raced = 0
        """Late or early lookups that found an answer before the upstream call did (that call
        cancelled)."""
        self.early = 0
        """Lookups raced from the start (`_races`)."""
        self.early_rare = 0
        """Of the early lookups, those raced because new questions rarely hit on their route."""
        self._lookup_s: float | None = None
        """A lookup's time when it embeds a new question (an EWMA over misses)."""
        self._upstream_s: dict[tuple[str, bool], float] = {}
        """Per route and streamed or not: the upstream's time to a unary answer, or to a
        stream's first chunk (EWMAs)."""
        self._new_hits: dict[str, _HitRate] = {}
        """Per route: how often a lookup that embedded a new question found an answer."""

    @property
    def ready(self) -> bool:
        return self.cache is not None

    async def start(self) -> None:
        try:
            from gateway.cache.semantic import SemanticCache
        except ImportError as e:
            log.error(
                "semantic cache enabled in the policy but its extra is not installed (%s): "
                "pip install 'llm-gateway[semantic]'. Continuing without it.",
                e,
            )
            return
        self._hub, self._own_hub = hub_for(self._redis_arg)
        # Its writes are bounded by their own timeout; a rebuild's scans move many entries.
        self.cache = SemanticCache(self.settings, redis=self._hub.blocking, hub=self._hub)
        await self.cache.start()
        log.warning(
            "semantic cache ready (%s entries loaded)", self.cache.stats().get("entries", 0)
        )

    async def aclose(self) -> None:
        if self.cache is not None:
            await self.cache.aclose()
        if self._hub is not None and self._own_hub:
            await self._hub.aclose()

    def plan(
        self,
        tenant: str,
        alias: str,
        body: dict[str, Any],
        route: SemanticRoute,
        namespace: str = "",
        routed: str = "",
    ) -> SemanticPlan | None:
        """What to look up, or None when this request is not semantically cacheable.

        `namespace` is the caller's `x-gateway-cache-namespace`: it keys the semantic cache like
        tenant, alias, earlier turns and answer-changing parameters do; so does `routed`, the
        routing decision's pools (`route_of`).
        """
        if self.cache is None or not route.enabled:
            return None
        if not route.allow_nonzero_temperature and body.get("temperature", 1) != 0:
            return None
        from gateway.cache.semantic import last_user_text, namespace_for

        messages = body["messages"]
        text = last_user_text(messages)
        if not text:
            return None
        params = {k: v for k, v in body.items() if k not in _NOT_PARAMS}
        if namespace:
            params["\x00namespace"] = namespace  # cannot collide with a request field
        if routed:  # where the routing decision sends it (another pool: another model)
            params["\x00route"] = routed
        return SemanticPlan(
            namespace_for(tenant, alias, messages, params),
            text,
            route.threshold,
            route.ttl_s,
            streamed=bool(body.get("stream")),
            route=routed,
            race_all=route.race_all,
        )

    async def lookup(self, plan: SemanticPlan) -> tuple[bytes, float] | None:
        """The cached answer and its similarity, or None.

        With `lookup_budget_ms`, a lookup still running after the budget is left in
        `plan.pending` and None is returned: the caller starts the upstream call and may race it
        against the lookup (`late_result`). So is, at once, a lookup raced from the start
        (`_races`), where its upstream is known to answer (a stream: to send its first chunk)
        slower than a lookup (so no hit is lost).
        """
        assert self.cache is not None
        budget = self.settings.lookup_budget_ms / 1000
        searched = self.cache.index.has_namespace(plan.namespace)  # else no embedding: not timed
        new = searched and not self.cache.worker.remembers(plan.text)  # it will embed
        task = asyncio.ensure_future(self.cache.lookup(plan.namespace, plan.text, plan.threshold))
        if new:
            task.add_done_callback(self._observer(plan.route, time.perf_counter()))
        why = self._races(plan, new) if searched else None
        if why is not None:
            self.early += 1
            self.early_rare += why == "rare_hits"
            plan.pending = task
            return None
        if budget > 0:
            done, _ = await asyncio.wait({task}, timeout=budget)
            if not done:
                self.late += 1
                plan.pending = task
                return None
        return self._count(plan, await task)

    def _races(self, plan: SemanticPlan, new: bool) -> str | None:
        """Why the plan's upstream call starts at once, beside its lookup, or None. Only where
        the route's upstream answers slower than a lookup: for an alias with `race_all`, a new
        question on a route where new questions rarely find an answer (`race_rare_hits`), or a
        question sharing no word with its context (`race_unrelated`)."""
        if not self._upstream_slower((plan.route, plan.streamed)):
            return None
        s = self.settings
        if plan.race_all:
            return "race_all"
        if new and s.race_rare_hits > 0:
            seen = self._new_hits.get(plan.route)
            if seen is not None and seen.seen >= MIN_NEW and seen.rate < s.race_rare_hits:
                return "rare_hits"
        assert self.cache is not None
        if s.race_unrelated and self.cache.index.unrelated(plan.namespace, plan.text):
            return "unrelated"
        return None

    def _upstream_slower(self, route: tuple[str, bool]) -> bool:
        """Whether the route's upstream answers in more than `RACE_MARGIN` lookups' time: a raced
        lookup then still answers first, so racing costs no hit. Unknown (no answer or no lookup
        timed yet): no."""
        upstream, lookup = self._upstream_s.get(route), self._lookup_s
        return upstream is not None and lookup is not None and upstream > RACE_MARGIN * lookup

    def _observer(self, route: str, start: float) -> Callable[[asyncio.Future[Any]], None]:
        """Records what a lookup that embeds took and whether it found an answer, raced or not
        (a raced lookup runs to its end: its vector serves the store)."""

        def done(task: asyncio.Future[Any]) -> None:
            if task.cancelled() or task.exception() is not None:
                return
            outcome = task.result().outcome
            if outcome not in ("hit", "miss", "rejected"):  # skipped: busy, too long, an error
                return
            self._lookup_s = _ewma(self._lookup_s, time.perf_counter() - start)
            rates = self._new_hits
            if route not in rates and len(rates) >= MAX_ROUTES:
                rates.clear()  # routes come from the policy: only a reload changes them
            rates.setdefault(route, _HitRate()).add(outcome == "hit")

        return done

    def observe_upstream(self, plan: SemanticPlan, seconds: float) -> None:
        """The plan's upstream answered (a stream: sent its first chunk) in `seconds`."""
        route = (plan.route, plan.streamed)
        if route not in self._upstream_s and len(self._upstream_s) >= MAX_ROUTES:
            self._upstream_s.clear()  # routes come from the policy: only a reload changes them
        self._upstream_s[route] = _ewma(self._upstream_s.get(route), seconds)

    def late_result(self, plan: SemanticPlan) -> tuple[bytes, float] | None:
        """What a late lookup found, once `plan.pending` is done (counted like any lookup)."""
        task = plan.pending
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return self._count(plan, task.result())

    def _count(self, plan: SemanticPlan, found: Any) -> tuple[bytes, float] | None:
        plan.vector = found.vector
        if found.outcome == "hit" and found.hit is not None:
            self.hits += 1
            plan.hit_id = found.hit.entry_id
            return found.hit.response, found.hit.similarity
        if found.outcome == "rejected":
            reason = found.reason or "unknown"
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
        else:
            self.misses += 1
        return None

    def invalid_hit(self, plan: SemanticPlan) -> None:
        """The entry a lookup found is not a valid answer (Redis is written by other
        processes): counted as a lookup rejected for `invalid_entry` instead of a hit, and
        removed from the index and from Redis in the background."""
        self.hits -= 1
        self.rejected["invalid_entry"] = self.rejected.get("invalid_entry", 0) + 1
        if self.cache is not None and plan.hit_id is not None:
            task = asyncio.get_running_loop().create_task(self.cache.discard(plan.hit_id))
            self._stores.add(task)
            task.add_done_callback(self._stores.discard)
        plan.hit_id = None

    def store(self, plan: SemanticPlan, body: bytes) -> asyncio.Task[bool] | None:
        """Store in the background; the task is returned so a refresh can wait for it.

        A refresh (`Cache-Control: no-cache`) exists to replace the entry, so its store waits for
        room in the embedding queue (up to `refresh_wait_s`) instead of being dropped; the other
        stores are refused at once when the queue is full (counted in `refused`).
        """
        if self.cache is None:
            return None
        wait_s = self.settings.refresh_wait_s if plan.refresh else 0.0
        task = asyncio.get_running_loop().create_task(self._store(plan, body, wait_s))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)
        return task

    async def _store(self, plan: SemanticPlan, body: bytes, wait_s: float) -> bool:
        assert self.cache is not None
        if plan.pending is not None:  # a late lookup: its vector is on the way
            with contextlib.suppress(Exception):
                plan.vector = (await plan.pending).vector
        return await self.cache.store(
            plan.namespace, plan.text, body, plan.ttl_s, vector=plan.vector, wait_s=wait_s
        )

    def not_stored(self, reason: str) -> None:
        """An answer the cache stage does not store (content_filter: a content filter stopped
        it; incomplete: a stream's assembled answer is not what was streamed; exact_too_big: an
        answer over the exact cache's max_entry_bytes)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def store_stats(self) -> tuple[int, dict[str, int]]:
        """Stores done and stores refused by reason (for metrics; the exact cache's refusals,
        `exact_*`, are counted here too, semantic cache or not)."""
        if self.cache is None:
            return 0, dict(self.skipped)
        refused = dict(self.cache.refused)
        for reason, n in self.skipped.items():
            refused[reason] = refused.get(reason, 0) + n
        return self.cache.stored, refused
