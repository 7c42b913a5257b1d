"""Cache: the exact cache (Redis or in memory), the semantic cache and single-flight.

Before: a hit answers at once (as a stream when the client asked for one); the first of several
identical requests leads, the others wait for its answer. A semantic lookup that outlasts its
budget, or whose question shares no word with its context, races the upstream call (a stream's
up to its first chunk). After: a complete answer is stored (a stream's once it has ended,
in `on_finish`); an answer that never came releases the followers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from gateway.cache.exact import Store, cacheable, exact_key, pack_entry, unpack_entry
from gateway.cache.replay import replay_events
from gateway.cache.semantic_layer import SemanticLayer, SemanticPlan
from gateway.cache.singleflight import LeaderGone, SingleFlight, wait
from gateway.context import Context
from gateway.errors import GatewayError, bad_request
from gateway.observability.tracing import stage
from gateway.pipeline.call import Call
from gateway.pipeline.reply import StreamReply, on_finish
from gateway.pipeline.stage import Next
from gateway.policy.schema import Alias, Policy
from gateway.routing.decision import Decision
from gateway.wire.answer_checks import InvalidAnswer, check_unary
from gateway.wire.request import ParsedRequest

JSON = "application/json"
log = logging.getLogger("gateway.cache")


def clamp_ttl(header: str | None, policy_ttl_s: int) -> int:
    """A client's `x-gateway-cache-ttl` may shorten the policy's TTL, never extend it; 0 means
    the answer is not stored. Anything but plain ASCII digits (str.isdigit also takes '²' and
    other scripts' digits, which int() refuses or reads otherwise) is ignored."""
    if header and len(header) <= 12 and header.isascii() and header.isdigit():
        return min(int(header), policy_ttl_s)
    return policy_ttl_s


NAMESPACE_HEADER = "x-gateway-cache-namespace"
#: A namespace is an opaque label the client chooses; it keys both caches (hashed, never stored).
NAMESPACE_MAX = 256
_NAMESPACE = re.compile(rf"[\x20-\x7e]{{1,{NAMESPACE_MAX}}}")


def cache_namespace(header: str | None) -> str:
    """The client's `x-gateway-cache-namespace`, or a 400 when it is not 1 to 256 printable
    ASCII characters. Refused, not ignored: a namespace the client relies on to keep its
    users' answers apart must never quietly become the shared default one."""
    if not header:
        return ""
    if _NAMESPACE.fullmatch(header) is None:
        raise bad_request(
            f"The {NAMESPACE_HEADER} header must be 1 to {NAMESPACE_MAX} printable ASCII "
            "characters.",
            param=NAMESPACE_HEADER,
            code="invalid_cache_namespace",
        )
    return header


def cache_directives(cache_control: str | None, pragma: str | None = None) -> frozenset[str]:
    """What the request's caching headers ask of the cache: "no-store" (neither read nor
    write) and "no-cache" (skip the lookup, store the fresh answer).

    Directives are matched whole, case-insensitively. `max-age=0` is a "no-cache" (the client
    accepts no stored answer, whatever its age, RFC 9111 5.2.1.1); a larger one is
    `cache_max_age`. `Pragma: no-cache` counts only without a Cache-Control header (RFC 9111
    5.4).
    """
    found: set[str] = set()
    if cache_control is None:
        if pragma is not None and any(p.strip().lower() == "no-cache" for p in pragma.split(",")):
            found.add("no-cache")
        return frozenset(found)
    for part in cache_control.split(","):
        name, _, value = part.partition("=")
        name = name.strip().lower()
        if name in ("no-store", "no-cache"):
            found.add(name)
        elif name == "max-age" and _delta_seconds(value) == 0:
            found.add("no-cache")
    return frozenset(found)


#: The largest max-age read (RFC 9111 1.2.2: a larger delta-seconds is taken as 2^31).
MAX_AGE_LIMIT = 2**31


def _delta_seconds(value: str) -> int | None:
    """A directive's seconds (quoted or not), capped at MAX_AGE_LIMIT; None unless ASCII digits.
    Bounded before int(): thousands of digits are past int()'s limit (it raised: a 500)."""
    value = value.strip().strip('"')
    if not (value.isascii() and value.isdigit()):
        return None
    return MAX_AGE_LIMIT if len(value) > 10 else min(int(value), MAX_AGE_LIMIT)


def cache_max_age(cache_control: str | None) -> int | None:
    """The request's `Cache-Control: max-age=N` (N > 0): serve an exact-cache entry only when
    it is younger than N seconds. None without one; anything but ASCII digits is ignored; N
    beyond 2^31 is 2^31; with several, the smallest (the strictest) counts."""
    if cache_control is None:
        return None
    found: int | None = None
    for part in cache_control.split(","):
        name, _, value = part.partition("=")
        n = _delta_seconds(value) if name.strip().lower() == "max-age" else None
        if n is not None:
            found = n if found is None else min(found, n)
    return found if found else None


def storable(body: bytes) -> bool:
    """Whether an answer may be stored: not when a content filter stopped one of its choices
    (`finish_reason: content_filter`). A filter's verdict is the provider's policy of the moment
    and often a false positive; stored, it would be the answer for the whole TTL, to every
    tenant-mate asking the same (and, in the semantic cache, a similar) question. Answers cut
    at max_tokens (`length`, part of the key) and tool calls (the tools are part of the key)
    are what the same request gets again: they are stored."""
    if b"content_filter" not in body:  # the usual answer: one byte scan, no parse
        return True
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return True
    return not any(
        isinstance(c, dict) and c.get("finish_reason") == "content_filter" for c in choices
    )


def route_of(decision: Decision) -> str:
    """Where the routing decision sends a request: the alias that serves it (a longer-context
    one for a long prompt) and its chain of pools (the request class picks the first, and an
    `x-gateway-priority` header picks the class). Part of both caches' keys: the same body
    routed to another pool is answered by another model, and a premium request was served the
    default pool's cached answer."""
    return f"{decision.alias_name}>{','.join(decision.chain)}"


def faithful(endpoint: str, completion: bytes) -> bool:
    """Whether the answer assembled from a stream is the answer the client was streamed.

    The assembler reads chat chunks' content and tool calls: a completions stream (its text is
    in `text`) became an answer of another shape, and a streamed refusal an empty answer, which
    were stored and served as the answer (the empty one to every later identical request). An
    assembled answer of another shape, or with neither text nor tool calls, is not stored."""
    try:
        doc = check_unary(endpoint, completion)
    except InvalidAnswer:
        return False
    if endpoint != "chat":
        return True
    for choice in doc["choices"]:
        msg = choice["message"]
        if not (msg.get("content") or msg.get("tool_calls") or msg.get("refusal")):
            return False
    return True


def uses_cache(policy: Policy, alias: Alias) -> bool:
    """Whether requests to `alias` (or to the longer-context aliases it reroutes to) may be
    cached: when not, the alias's stack leaves this stage out."""
    seen: set[int] = set()
    a: Alias | None = alias
    while a is not None and id(a) not in seen:
        seen.add(id(a))
        if a.cache.exact.enabled or a.cache.semantic.enabled:
            return True
        a = policy.models.get(a.fallback_alias) if a.fallback_alias else None
    return False


def describe(acc: ParsedRequest, alias: Alias, cache_control: str | None) -> dict[str, Any]:
    """What this stage would do with a request (the explain view)."""
    settings = alias.cache.exact
    reason = None
    if not settings.enabled:
        reason = "exact cache disabled for this alias"
    elif acc.endpoint != "embeddings" and not cacheable(acc.body, settings):
        reason = "sampled request (temperature is not 0)"
    elif "no-store" in cache_directives(cache_control):
        reason = "cache-control: no-store"
    return {
        "exact": {
            "enabled": settings.enabled,
            "cacheable": reason is None,
            "reason": reason,
            "ttl_s": settings.ttl_s,
        }
    }


@dataclass(slots=True)
class CachePlan:
    key: str
    read: bool
    write: bool
    ttl_s: int
    semantic: SemanticPlan | None = None
    leader: bool = False
    max_age_s: int | None = None  # the client's Cache-Control max-age: older entries are misses
    max_entry_bytes: int = 2**20  # larger answers are not stored in the exact cache
    keep: bool = True  # False: the client's `x-gateway-cache-ttl: 0`, the answer is not stored


def _failed(call: asyncio.Future[Response]) -> bool:
    """A finished upstream call that gave no answer: an error raised, or a status other than 200."""
    if call.cancelled() or call.exception() is not None:
        return True
    return call.result().status_code != 200


class Cache:
    name = "cache"

    def __init__(self, exact: Store, semantic: SemanticLayer, flights: SingleFlight) -> None:
        self.exact, self.semantic, self.flights = exact, semantic, flights
        self.invalid_entries = 0  # cached entries found invalid (served as misses)
        self.unstored = 0  # answers not stored (a content filter stopped them, incomplete)

    async def __call__(self, call: Call, next: Next) -> Response:
        ctx, acc = call.ctx, call.acc
        plan = self.plan(acc, call.decision.alias, ctx, call.headers, route_of(call.decision))
        if plan is None:
            return await next(call)
        with stage(ctx, "cache"):
            cached = await self._lookup(plan, ctx)
        if cached is not None:
            hit = self._from_cache(cached, acc, ctx, plan)
            if hit is not None:
                return hit
        call.want_completion = True
        pending = plan.semantic.pending if plan.semantic is not None else None
        started = time.perf_counter()
        try:
            if pending is not None:
                response = await self._race(call, next, plan, pending)
                if ctx.cache == "hit-semantic":
                    return response
            else:
                response = await next(call)
            if plan.semantic is not None and response.status_code == 200:
                # What waiting for a lookup would add to this route's answers (race_unrelated):
                # a stream's reply is ready at its first chunk.
                self.semantic.observe_upstream(plan.semantic, time.perf_counter() - started)
        except GatewayError as e:
            self._abort(plan, e)
            raise
        except BaseException:
            self._abort(plan, LeaderGone())
            raise
        if response.status_code != 200:
            self._abort(plan, LeaderGone())
        elif isinstance(response, StreamReply):
            on_finish(response, lambda: self._stream_ended(plan, response, acc.endpoint))
        else:
            refresh = self._store(plan, bytes(response.body))
            if refresh is not None:
                # Back-pressure: a burst of refreshes is slowed to the embedder's pace instead of
                # losing stores. The store never raises; the wait is bounded by refresh_wait_s.
                await asyncio.wait({refresh})
        return response

    def plan(
        self,
        acc: ParsedRequest,
        alias: Alias,
        ctx: Context,
        headers: Mapping[str, str],
        route: str = "",
    ) -> CachePlan | None:
        namespace = cache_namespace(headers.get(NAMESPACE_HEADER))
        cc = cache_directives(headers.get("cache-control"), headers.get("pragma"))
        if "no-store" in cc:
            return None
        exact = alias.cache.exact
        use_exact = exact.enabled and (acc.endpoint == "embeddings" or cacheable(acc.body, exact))
        semantic = None
        if acc.endpoint == "chat":
            semantic = self.semantic.plan(
                ctx.tenant, acc.model, acc.body, alias.cache.semantic, namespace, route
            )
        if not use_exact and semantic is None:
            return None
        ttl_header = headers.get("x-gateway-cache-ttl")
        ttl = clamp_ttl(ttl_header, exact.ttl_s)  # policies' TTLs are >= 1: 0 only if asked
        if ttl_header and semantic is not None and ttl > 0:
            limit = semantic.ttl_s if semantic.ttl_s is not None else self.semantic.settings.ttl_s
            semantic.ttl_s = max(1, clamp_ttl(ttl_header, int(limit)))
        key = exact_key(ctx.tenant, acc.model, acc.endpoint, acc.body, namespace, route)
        ctx.cache = "miss"
        if semantic is not None and "no-cache" in cc:
            semantic.refresh = True
        return CachePlan(
            key,
            read="no-cache" not in cc,
            write=use_exact,
            ttl_s=ttl,
            semantic=semantic,
            max_age_s=cache_max_age(headers.get("cache-control")),
            max_entry_bytes=exact.max_entry_bytes,
            keep=ttl > 0,
        )

    async def _lookup(self, plan: CachePlan, ctx: Context) -> bytes | None:
        if plan.read and plan.write:
            raw = await self.exact.get(plan.key)
            hit = self._fresh_enough(plan, raw) if raw is not None else None
            if hit is not None:
                ctx.cache = "hit-exact"
                return hit
        # Semantic entries do not record their age: under a client's max-age they are of
        # unknown age, so not served (as exact entries written before entries recorded it).
        if plan.read and plan.semantic is not None and plan.max_age_s is None:
            found = await self.semantic.lookup(plan.semantic)
            if found is not None:
                ctx.cache, ctx.similarity = "hit-semantic", found[1]
                return found[0]
        if not plan.write:
            # The exact cache is off for this request (the alias, or a sampled request):
            # identical requests do not share an answer either.
            return None
        fut = self.flights.join(plan.key)
        if fut is None:
            plan.leader = True
            return None
        shared = await wait(fut, 60.0)  # bounded: nothing waits forever
        if shared is not None:
            ctx.cache = "hit-exact" if plan.read else "miss"
        return shared

    @staticmethod
    def _fresh_enough(plan: CachePlan, raw: bytes) -> bytes | None:
        """The entry's answer, or None (a miss) when the client's max-age excludes it: older
        than max-age, or of unknown age (written before entries recorded it)."""
        stored_at, body = unpack_entry(raw)
        if plan.max_age_s is None:
            return body
        if stored_at is None:
            return None
        # An entry a little in the future (another replica's clock) is taken as new.
        return body if time.time() - stored_at < plan.max_age_s else None

    async def _race(
        self, call: Call, next: Next, plan: CachePlan, lookup: asyncio.Future[Any]
    ) -> Response:
        """The semantic lookup outlasted its budget, or was raced from the start: the upstream
        call starts now. If the lookup finds an answer first (for a stream: before the upstream's
        first chunk, nothing sent yet), that answer is served and the call cancelled (one
        upstream call spent on a hit: counted in the `raced` lookups); so it is when the call
        fails first (an outage: open breakers fail at once), as it would have been had the
        request waited for its lookup."""
        assert plan.semantic is not None
        ctx = call.ctx
        upstream = asyncio.ensure_future(next(call))
        try:
            await asyncio.wait({upstream, lookup}, return_when=asyncio.FIRST_COMPLETED)
            if upstream.done() and _failed(upstream) and not lookup.done():
                await asyncio.wait({lookup})
        except BaseException:
            # The request was cancelled (its client left): `wait` does not pass that on to
            # the call it waits on, which went on upstream with no one to answer.
            upstream.cancel()
            raise
        if not upstream.done() or _failed(upstream):
            found = self.semantic.late_result(plan.semantic)
            if found is not None:
                # Checked before the call is cancelled: an entry that is not a valid answer
                # (a miss) leaves the call running (cancelled first, it left a 500).
                ctx.cache, ctx.similarity = "hit-semantic", found[1]
                hit = self._from_cache(found[0], call.acc, ctx, plan)
                if hit is not None:
                    upstream.cancel()
                    with contextlib.suppress(BaseException):
                        await upstream
                    self.semantic.raced += 1
                    if plan.leader:
                        self.flights.resolve(plan.key, found[0])
                        plan.leader = False
                    return hit
        return await upstream

    def _from_cache(
        self, body: bytes, acc: ParsedRequest, ctx: Context, plan: CachePlan | None = None
    ) -> Response | None:
        """The cached answer for the client; None (a miss) for an entry that is not a valid
        answer of the endpoint: entries come back from Redis, which other processes write (or
        an older gateway that cached unchecked answers), so they are checked like an upstream's
        answer before they are served, never a 500 or an HTML page as a 200."""
        try:
            completion = check_unary(acc.endpoint, body)
        except InvalidAnswer as e:
            self.invalid_entries += 1
            log.warning("cached %s entry not served: %s", ctx.cache, e)
            ctx.similarity = None  # not a semantic hit: no similarity header either
            if ctx.cache == "hit-semantic" and plan is not None and plan.semantic is not None:
                # Counted as a rejected lookup, not a hit, and dropped: it would be found
                # again by every similar question.
                self.semantic.invalid_hit(plan.semantic)
            ctx.cache = "miss"
            return None
        if not acc.stream:
            return Response(body, headers=ctx.headers(), media_type=JSON)
        include_usage = bool((acc.body.get("stream_options") or {}).get("include_usage"))
        events = replay_events(acc.endpoint, completion, include_usage)
        return Response(b"".join(events), headers=ctx.headers(), media_type="text/event-stream")

    def _store(self, plan: CachePlan, body: bytes) -> asyncio.Task[bool] | None:
        """Store the answer; returns the semantic store task of a refresh (to wait on).

        The identical requests waiting on this one get the answer whatever it is (they asked at
        the same moment); an answer a content filter stopped is not stored (`storable`)."""
        if plan.leader:
            self.flights.resolve(plan.key, body)
        if not plan.keep:
            return None
        if not storable(body):
            self._unstored(plan, "content_filter")
            return None
        if plan.write:
            if len(body) > plan.max_entry_bytes:
                self._unstored(plan, "too_big", exact=True)
            else:
                entry = pack_entry(body, time.time())
                asyncio.get_running_loop().create_task(self.exact.set(plan.key, entry, plan.ttl_s))
        if plan.semantic is not None:
            task = self.semantic.store(plan.semantic, body)
            return task if plan.semantic.refresh else None
        return None

    def _stream_ended(self, plan: CachePlan, reply: StreamReply, endpoint: str) -> None:
        completion: bytes | None = getattr(reply, "completion", None)
        if completion is None or not faithful(endpoint, completion):
            # The identical requests waiting on this one go upstream themselves.
            if completion is not None:
                self._unstored(plan, "incomplete")
            self._abort(plan, LeaderGone())
        else:
            self._store(plan, completion)

    def _unstored(self, plan: CachePlan, reason: str, exact: bool = False) -> None:
        """An answer the caches do not keep: counted here, and as a refused store
        (`gateway_semantic_stores_total{outcome="refused",reason}`): for the semantic cache,
        or, `exact`, for the exact cache only (reason `exact_<reason>`)."""
        self.unstored += 1
        if exact:
            self.semantic.not_stored(f"exact_{reason}")
        elif plan.semantic is not None:
            self.semantic.not_stored(reason)

    def _abort(self, plan: CachePlan, exc: BaseException) -> None:
        if plan.leader:
            self.flights.fail(plan.key, exc)
