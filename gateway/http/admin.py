"""Admin API: live state of members and pools, drain, breakers, the dashboard's data.

Guard: `Authorization: Bearer $GATEWAY_ADMIN_KEY`; without a key, loopback clients only. The
dashboard's static files carry no data: with a key they are served to anyone (the page then asks
for the key), without one to loopback clients only, like the API they call.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, bad_request, too_large
from gateway.governance.keys import duplicate_member
from gateway.governance.static_keys import bearer_key
from gateway.pipeline.stages.accept import read_body
from gateway.policy.schema import ENV_REF
from gateway.redact import redacted_dump
from gateway.resilience.breaker import BreakerState
from gateway.resilience.drains import SharedDrains

if TYPE_CHECKING:
    from gateway.observability.recent import RecentRequests
    from gateway.pipeline.stack import Pipeline
    from gateway.policy.watcher import PolicyReloader
    from gateway.runtime import ProviderState, Runtime

_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
# Admin bodies are small JSON documents (a key spec is ~1 KB): a larger one is refused while it
# arrives, never read whole.
MAX_ADMIN_BODY_BYTES = 1 << 20
MAX_QUERY_VALUE_CHARS = 256
_ECHO = 40  # characters of a refused query name or value echoed in the error
_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no", ""})
STATIC = Path(__file__).resolve().parents[1] / "static"
_STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


def is_admin(request: Request) -> bool:
    """The admin key when one is set, else a loopback client (the same rule as require_admin)."""
    try:
        require_admin(request)
    except GatewayError:
        return False
    return True


def require_admin(request: Request) -> None:
    key = os.environ.get("GATEWAY_ADMIN_KEY", "").strip()
    if key:
        # The scheme in any case, spaces around the key, as for API keys; compared as digests,
        # so neither the key's content nor its length shows in the time taken.
        given = bearer_key(request.headers.get("authorization")) or ""
        if not hmac.compare_digest(_digest(given), _digest(key)):
            raise GatewayError(401, "Admin API key required.", code="invalid_admin_key")
        return
    _require_loopback(request)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def _require_loopback(request: Request) -> None:
    host = request.client.host if request.client else ""
    if host not in _LOOPBACK:
        raise GatewayError(
            403,
            "Admin API is loopback-only until GATEWAY_ADMIN_KEY is set.",
            code="admin_forbidden",
        )


def require_dashboard(request: Request) -> None:
    """The page itself holds no data: public with an admin key (it asks for it), else loopback."""
    if not os.environ.get("GATEWAY_ADMIN_KEY", "").strip():
        _require_loopback(request)


async def admin_body(request: Request) -> bytes:
    """An admin request's body, at most MAX_ADMIN_BODY_BYTES (a 413 as soon as it is larger,
    by its content-length or while it arrives)."""
    try:
        return await read_body(request, MAX_ADMIN_BODY_BYTES)
    except GatewayError as e:
        if e.status == 413:
            raise too_large(MAX_ADMIN_BODY_BYTES) from None
        raise


def _echo(text: str) -> str:
    shown = text[:_ECHO].encode("unicode_escape").decode("ascii")
    return shown + ("..." if len(text) > _ECHO else "")


def query_params(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """An admin route's query: only the names it takes, each at most once, values bounded and
    printable (a typo or a repeated name is a 400, never silently another answer)."""
    out: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in allowed:
            raise bad_request(
                f"Unknown query parameter '{_echo(name)}' (this route takes: "
                f"{', '.join(sorted(allowed)) or 'none'}).",
                param=_echo(name),
                code="invalid_query",
            )
        if name in out:
            raise bad_request(f"'{name}' given twice.", param=name, code="invalid_query")
        if len(value) > MAX_QUERY_VALUE_CHARS or not value.isprintable():
            raise bad_request(
                f"'{name}' must be printable text of at most {MAX_QUERY_VALUE_CHARS} characters.",
                param=name,
                code="invalid_query",
            )
        out[name] = value
    return out


def query_flag(params: dict[str, str], name: str) -> bool:
    value = params.get(name, "").lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f"'{name}' must be true or false.", param=name, code="invalid_query")


def _json(data: object, status: int = 200) -> Response:
    return Response(
        orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def member_view(p: ProviderState, pools: list[str], recent: RecentRequests | None) -> dict:
    m = p.member
    now = time.monotonic()
    return {
        "name": p.name,
        "pools": pools,
        "drained": p.drained,
        "available": p.available(),
        "weight": m.weight,
        "inflight": m.inflight,
        "max_inflight": m.max_inflight,
        "ewma_ms": round(m.ewma.estimate() * 1000, 3),
        "cost": m.cost(),
        "observations": m.ewma.observations,
        "attempts": p.requests,
        "failures": m.failures,
        "auth_failed": p.auth_failed_at is not None,
        "last_error": None
        if m.last_error_at is None
        else {"kind": m.last_error_kind, "age_s": round(now - m.last_error_at, 1)},
        "breaker": p.breaker.snapshot(),
        "recent_errors": recent.errors_of(p.name) if recent is not None else [],
    }


class AdminViews:
    """Read-only views of the running gateway, shared by the admin API and the dashboard."""

    def __init__(
        self,
        runtime: Runtime,
        pipeline: Pipeline,
        reloader: PolicyReloader,
        recent: RecentRequests | None,
        source: str,
        drains: SharedDrains | None = None,
    ) -> None:
        self.runtime, self.pipeline, self.reloader = runtime, pipeline, reloader
        self.recent, self.source = recent, source
        # Where an operator's drain reaches (this process only unless the app shares it).
        self.drains = drains if drains is not None else SharedDrains(runtime, None, "")
        self.started = time.time()

    def _pools_of(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pname, pool in self.runtime.snapshot.policy.pools.items():
            for m in pool.members:
                out.setdefault(m, []).append(pname)
        return out

    def members(self) -> list[dict]:
        pools_of = self._pools_of()
        return [
            member_view(p, pools_of.get(name, []), self.recent)
            for name, p in self.runtime.snapshot.providers.items()
        ]

    def pools(self, members: list[dict] | None = None) -> list[dict]:
        snap = self.runtime.snapshot
        stats = self.pipeline.dispatcher.admission.stats
        by_name = {m["name"]: m for m in (members or [])}
        out = []
        for name, pool in snap.policy.pools.items():
            q = stats.get(name)
            out.append(
                {
                    "name": name,
                    "members": [by_name.get(m, m) for m in pool.members],
                    "healthy": sum(snap.providers[m].available() for m in pool.members),
                    "strategy": pool.balancer.strategy,
                    "latency_signal": pool.latency_signal,
                    "affinity": pool.affinity.enabled,
                    "fallback": pool.fallback,
                    "max_attempts": pool.max_attempts,
                    "queue": {
                        **pool.queue.model_dump(),
                        "depth": q.depth if q else 0,
                        "admitted_after_wait": q.admitted_after_wait if q else 0,
                        "shed": q.shed if q else 0,
                        "wait_s_total": q.wait_s_total if q else 0.0,
                        "last_wait_s": q.last_wait_s if q else 0.0,
                    },
                }
            )
        return out

    def policy(self) -> dict:
        r = self.reloader
        return {
            "version": self.runtime.snapshot.version,
            "source": self.source,
            "reloads": r.reloads,
            "reload_failures": r.failures,
            "last_error": r.last_error,
        }

    def stats(self) -> dict:
        members = self.members()
        degradation = self.pipeline.degradation
        return {
            "now": time.time(),
            "uptime_s": round(time.time() - self.started, 1),
            "policy": self.policy(),
            "models": {
                name: {"pool": a.pool, "routes": a.routes}
                for name, a in self.runtime.snapshot.policy.models.items()
            },
            "pools": self.pools(members),
            "traffic": self.recent.summary() if self.recent is not None else None,
            "degraded_total": degradation.degraded,
            "deferred_total": degradation.queued,
        }


def _interpolated_values(source: str) -> list[str]:
    """Values of the environment variables the policy file interpolates: all masked in views."""
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return []
    return [os.environ[m.group(1)] for m in ENV_REF.finditer(text) if m.group(1) in os.environ]


def _member(runtime: Runtime, name: str) -> ProviderState:
    p = runtime.snapshot.providers.get(name)
    if p is None:
        raise GatewayError(404, f"No member named '{_echo(name)}'.", code="member_not_found")
    return p


async def _breaker_state(request: Request) -> BreakerState:
    raw = await admin_body(request)
    try:
        if duplicate_member(raw) is not None:
            raise ValueError("a member given twice")  # which one was meant is unknown
        body: Any = orjson.loads(raw)
        return BreakerState(body["state"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise GatewayError(
            400,
            'Send {"state": "open" | "closed" | "half_open"}.',
            param="state",
            code="invalid_breaker_state",
        ) from None


_NONE: frozenset[str] = frozenset()


def admin_router(views: AdminViews) -> APIRouter:
    """Admin routes (all behind `require_admin`)."""
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])
    runtime = views.runtime

    @router.get("/members")
    async def members(request: Request) -> Response:
        query_params(request, _NONE)
        return _json({"members": views.members()})

    @router.get("/pools")
    async def pools(request: Request) -> Response:
        query_params(request, _NONE)
        return _json({"pools": views.pools()})

    @router.get("/policy")
    async def policy(request: Request) -> Response:
        full = query_flag(query_params(request, frozenset({"full"})), "full")
        doc = views.policy()
        if full:
            snap = runtime.snapshot
            # The values the running policy took from the environment, and those the file
            # on disk names now (a refused reload's file may name others).
            taken = [*snap.policy._interpolated, *_interpolated_values(views.source)]
            redactor = snap.redactor.extended(taken)
            doc["policy"] = redacted_dump(snap.policy.model_dump(mode="json"), redactor)
        return _json(doc)

    @router.get("/breakers")
    async def breakers(request: Request) -> Response:
        query_params(request, _NONE)
        snap = runtime.snapshot
        return _json({name: p.breaker.snapshot() for name, p in snap.providers.items()})

    @router.get("/stats")
    async def stats(request: Request) -> Response:
        query_params(request, _NONE)
        return _json(views.stats())

    @router.post("/members/{name}/drain")
    async def drain(name: str) -> Response:
        _member(runtime, name)
        await views.drains.change(name, True)
        return _json({"name": name, "drained": True, "scope": views.drains.scope})

    @router.post("/members/{name}/undrain")
    async def undrain(name: str) -> Response:
        _member(runtime, name)
        await views.drains.change(name, False)
        return _json({"name": name, "drained": False, "scope": views.drains.scope})

    @router.post("/members/{name}/breaker")
    async def force_breaker(name: str, request: Request) -> Response:
        p = _member(runtime, name)
        p.breaker.force(await _breaker_state(request))
        return _json({"name": name, "breaker": p.breaker.snapshot()})

    return router


def dashboard_router() -> APIRouter:
    """The dashboard page and its two static files (no build step, no CDN)."""
    router = APIRouter(dependencies=[Depends(require_dashboard)])
    headers = {"cache-control": "no-cache"}

    @router.get("/dashboard")
    async def page() -> Response:
        html = (STATIC / "dashboard.html").read_bytes()
        return Response(html, media_type="text/html; charset=utf-8", headers=headers)

    @router.get("/dashboard/{name}")
    async def asset(name: str) -> Response:
        media = _STATIC_FILES.get(name)
        if media is None:
            raise GatewayError(404, "Unknown URL.", code="unknown_url")
        return Response((STATIC / name).read_bytes(), media_type=media, headers=headers)

    return router
