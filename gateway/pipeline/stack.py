"""One request, end to end, as a stack of stages (gateway.pipeline.stage), outermost first:

    Record -> Trace -> Translate -> Authenticate -> Accept          the front, the same for all
      -> Classify -> Limit -> Degrade -> Cache -> Failover          the alias's stack

The front ends by handing the request to its alias's stack, composed once per policy version from
what the alias uses (no Cache stage for an alias that caches nothing; Trace only when tracing is
on, Translate only for the other inbound APIs). A replay from the deferred queue runs the same
alias stack under Record, as the tenant that sent it; explain runs Authenticate, Accept and
Classify and ends in a dry run (gateway.pipeline.explain) instead of Failover.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response

from gateway import errors
from gateway.apis.exchange import InboundAPI
from gateway.cache.exact import MemoryLRU, RedisStore, Store
from gateway.cache.semantic_layer import SemanticLayer
from gateway.cache.semantic_settings import SemanticSettings
from gateway.cache.singleflight import SingleFlight
from gateway.context import Context
from gateway.governance.service import GovernanceService, Principal
from gateway.infra.shared_state import SharedState
from gateway.observability.tracing import Tracing
from gateway.pipeline.call import Call
from gateway.pipeline.reply import finish_now
from gateway.pipeline.router import Router
from gateway.pipeline.stage import Next, Stage, compose
from gateway.pipeline.stages.accept import Accept
from gateway.pipeline.stages.authenticate import Authenticate
from gateway.pipeline.stages.cache import Cache, uses_cache
from gateway.pipeline.stages.classify import Classify
from gateway.pipeline.stages.degrade import Degrade
from gateway.pipeline.stages.failover import Failover
from gateway.pipeline.stages.limit import Limit
from gateway.pipeline.stages.record import Record
from gateway.pipeline.stages.trace import Trace
from gateway.pipeline.stages.translate import Translate
from gateway.resilience.deferred import ReplayEntry
from gateway.resilience.degradation import Degradation
from gateway.runtime import Runtime, Snapshot
from gateway.wire.request import Endpoint

Observer = Callable[[Context], None]


_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count(1)


def new_request_id() -> str:
    """32 hex digits: 16 random ones drawn once per process, then a counter. Unique across
    processes and restarts without a system call per request (ids are correlation only; anything
    that must be unguessable, like a deferred id, draws its own)."""
    return f"{_ID_PREFIX}{next(_ids):016x}"


_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:")
MAX_REQUEST_ID = 128


def client_request_id(value: str | None) -> str:
    """The client's `x-request-id` when short and plain (it is echoed and logged), else a new one.

    It is correlation only: nothing (deferred results, cache keys) is looked up by it.
    """
    if value and len(value) <= MAX_REQUEST_ID and _ID_CHARS.issuperset(value):
        return value
    return new_request_id()


class Pipeline:
    def __init__(
        self,
        runtime: Runtime,
        state: SharedState | None = None,
        degradation: Degradation | None = None,
        semantic: SemanticLayer | None = None,
    ) -> None:
        self.runtime = runtime
        self.state = state or SharedState(None)
        self.degradation = degradation or Degradation(None, None)
        self.semantic = semantic or SemanticLayer(SemanticSettings(), None, "gw:")
        self.exact: Store = RedisStore(self.state) if self.state.enabled else MemoryLRU()
        self.flights = SingleFlight()
        self.governance = GovernanceService(self.state, runtime)
        self.governance.fair.waiting = self._pool_waiting
        # Record-step observers; governance first: it sets the cost the others log.
        self.observers: list[Observer] = [self.governance.record]
        self.tracing = Tracing()  # off; see gateway.observability.tracing
        # The stages, each built once.
        self.dispatcher = Failover(Router())
        self.recorder = Record(self.observers)
        self.authenticate = Authenticate(self.governance)
        self.accept = Accept()
        self.classify = Classify()
        self.limit = Limit(self.governance)
        self.degrade = Degrade(self.degradation)
        self.cache = Cache(self.exact, self.semantic, self.flights)
        self._stacks: dict[str, Next] = {}
        self._stacks_of: Snapshot | None = None  # the policy version the stacks were built for
        self._fronts: dict[bool, Next] = {}
        self._replay = compose([self.recorder], self._replay_accept)
        self.set_tracing(self.tracing)

    def _pool_waiting(self, pool: str) -> bool:
        stats = self.dispatcher.admission.stats.get(pool)
        return stats is not None and stats.depth > 0

    def observe(self, observer: Observer | None) -> None:
        """Register a record-step observer (metrics, logs, traces); None is skipped."""
        if observer is not None and observer not in self.observers:
            self.observers.append(observer)

    def record(self, ctx: Context) -> None:
        """Every observer sees a finished request once (see the Record stage)."""
        self.recorder.record(ctx)

    def set_tracing(self, tracing: Tracing) -> None:
        """Tracing on or off: the Trace stage is in the front only when it is on."""
        self.tracing = tracing
        traced: list[Stage] = [Trace(tracing)] if tracing.enabled else []
        for inbound in (False, True):
            front: list[Stage] = [self.recorder, *traced]
            if inbound:
                front.append(Translate())
            front += [self.authenticate, self.accept]
            self._fronts[inbound] = compose(front, self._by_alias)

    # -- the stacks -----------------------------------------------------------------------------

    def alias_stages(self, snap: Snapshot, alias: str) -> list[Stage]:
        """What runs for a request to `alias` once it is accepted, in order."""
        stages: list[Stage] = [self.classify, self.limit]
        if snap.policy.degradation.rules is not None:
            stages.append(self.degrade)  # without rules, an exhausted request is its error
        if uses_cache(snap.policy, snap.policy.models[alias]):
            stages.append(self.cache)
        return stages

    def _stack(self, snap: Snapshot, alias: str) -> Next:
        if self._stacks_of is not snap:
            self._stacks, self._stacks_of = {}, snap
        stack = self._stacks.get(alias)
        if stack is None:
            stack = self._stacks[alias] = compose(self.alias_stages(snap, alias), self.dispatcher)
        return stack

    def _by_alias(self, call: Call) -> Awaitable[Response]:
        return self._stack(call.snap, call.acc.model)(call)

    # -- entry points ---------------------------------------------------------------------------

    async def handle(
        self, request: Request, endpoint: Endpoint, inbound: InboundAPI | None = None
    ) -> Response:
        """One request of `endpoint`; with `inbound` (gateway.apis), another API's request
        translated to chat on the way in and its answer translated back on the way out."""
        ctx = Context("", time.perf_counter())
        exchange = None
        if inbound is not None:
            ctx.endpoint, exchange = inbound.name, inbound.begin()
        else:
            ctx.endpoint = endpoint
        call = Call(ctx, self.runtime.snapshot, endpoint, request, exchange)
        ctx.request_id = client_request_id(call.headers.get("x-request-id"))
        return await self._fronts[exchange is not None](call)

    async def replay_send(self, entry: ReplayEntry) -> tuple[int, bytes]:
        """Re-send a deferred request for the replay worker: (status, body).

        It runs as the tenant that sent it, through the same stages as a live request (class
        rules, limits, cache lookup and store, failover), and is recorded like one (access log,
        metrics) under its deferred id; a failure is not degraded (the worker retries it).
        """
        ctx = Context(entry.request_id or new_request_id(), time.perf_counter())
        ctx.tenant, ctx.endpoint, ctx.replay = entry.tenant or "default", "chat", True
        ctx.request_body = entry.body
        call = Call(ctx, self.runtime.snapshot, "chat")
        call.raw = entry.body
        call.principal = self._replay_principal(entry, ctx)
        response = await self._replay(call)
        finish_now(response)  # recorded now: the answer is stored, not sent
        return response.status_code, bytes(response.body)

    async def _replay_accept(self, call: Call) -> Response:
        principal = call.principal
        if principal.record is not None and (
            principal.record.revoked or not principal.record.usable(time.time())
        ):
            raise errors.unauthorized("The API key that sent this request is no longer valid.")
        return await self.accept(call, self._by_alias)

    def _replay_principal(self, entry: ReplayEntry, ctx: Context) -> Principal:
        """Who a replay runs as: the tenant and key that sent the request, so that their limits,
        budgets and allowed aliases apply (a refusal is retried later by the worker). A managed
        key revoked or expired since then fails the replay."""
        ctx.key_id = entry.key_id
        record = self.governance.keys.get(entry.key_id) if entry.key_id else None
        return Principal(ctx.tenant, entry.key_id, record)

    def explain_stack(self, end: Next) -> Next:
        """Authenticate, Accept and Classify, then `end` (a dry run) instead of the rest."""
        stages: Sequence[Stage] = [self.authenticate, self.accept, self.classify]
        return compose(stages, end)
