"""Admin API of governance: managed keys, spend, usage against limits (behind `require_admin`).

POST   /admin/keys               create; the answer holds the plaintext key, shown this once
GET    /admin/keys               list (no hashes, no plaintext)
GET    /admin/keys/{id}          one key
PATCH  /admin/keys/{id}          change name, tenant, expiry, aliases, limits, budget
POST   /admin/keys/{id}/rotate   new secret, same key; the old secret stops at once
POST   /admin/keys/{id}/revoke   refused by every replica within a second
GET    /admin/spend              ?tenant=&key=&alias=&from=&to=&group_by=day|model|provider|...
GET    /admin/usage              per tenant: limits, what is left, in flight, budgets spent
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, ValidationError
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, bad_request
from gateway.governance.keys import KeyCreate, KeyRecord, KeyUpdate, parse_admin
from gateway.governance.spend import GROUPS, NANO
from gateway.http.admin import admin_body, query_params, require_admin

if TYPE_CHECKING:
    from gateway.governance.service import GovernanceService
    from gateway.runtime import Runtime

MAX_DAYS = 366
_NULLABLE = frozenset({"expires_at"})  # PATCH fields whose null means something (no expiry)
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_SPEND_QUERY = frozenset({"tenant", "key", "alias", "from", "to", "group_by"})
_KEYS_QUERY = frozenset({"tenant"})
log = logging.getLogger("gateway.governance")


def _json(data: object, status: int = 200) -> Response:
    return Response(
        orjson.dumps(data),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


async def _body(request: Request, model: type[BaseModel]) -> Any:
    try:
        return parse_admin(model, await admin_body(request) or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or None
        message = f"{loc}: {first['msg']}" if loc else str(first["msg"])
        raise bad_request(message, param=loc, code="invalid_key_spec") from None


def _not_found(key_id: str) -> GatewayError:
    return GatewayError(404, f"No managed key '{key_id[:64]}'.", code="key_not_found")


def _unavailable() -> GatewayError:
    # The gateway's side failed, not the request: a server error type, as OpenAI types its 5xx.
    return GatewayError(
        503,
        "The shared key store (Redis) is unreachable.",
        type="server_error",
        code="key_store_unavailable",
    )


def _public(recs: list[KeyRecord], gov: GovernanceService) -> list[dict[str, Any]]:
    """Records as the admin API shows them; one that cannot be shown is left out (logged,
    counted), never a failed listing."""
    out = []
    for r in recs:
        try:
            doc = r.public()
            orjson.dumps(doc)
        except (ValueError, TypeError, orjson.JSONEncodeError):
            gov.keys.malformed += 1
            log.warning("managed key %s cannot be shown: left out of the listing", r.id)
            continue
        out.append(doc)
    return out


def _day(value: str | None, default: dt.date, name: str) -> dt.date:
    if not value:
        return default
    # The whole value (a prefix that happens to be a date is not one): fromisoformat alone also
    # takes 20260101 and 2026-W01-1.
    if _DATE.fullmatch(value):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise bad_request(
        f"'{name}' must be a date (YYYY-MM-DD).", param=name, code="invalid_query"
    ) from None


def governance_router(gov: GovernanceService, runtime: Runtime) -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    @router.post("/keys")
    async def create(request: Request) -> Response:
        spec: KeyCreate = await _body(request, KeyCreate)
        try:
            rec, secret = await gov.keys.create(spec)
        except (RedisError, OSError):
            raise _unavailable() from None
        return _json({**rec.public(), "key": secret}, 201)

    @router.get("/keys")
    async def list_keys(request: Request) -> Response:
        tenant = query_params(request, _KEYS_QUERY).get("tenant")
        recs = [r for r in gov.keys.all() if tenant is None or r.tenant == tenant]
        return _json({"keys": _public(recs, gov)})

    @router.get("/keys/{key_id}")
    async def get_key(key_id: str, request: Request) -> Response:
        query_params(request, frozenset())
        rec = gov.keys.get(key_id)
        shown = _public([rec], gov) if rec is not None else []
        if not shown:
            raise _not_found(key_id)
        return _json(shown[0])

    async def _change(key_id: str, op: Any) -> KeyRecord | tuple[KeyRecord, str]:
        try:
            out = await op
        except (RedisError, OSError):
            raise _unavailable() from None
        if out is None:
            raise _not_found(key_id)
        return out  # type: ignore[no-any-return]

    @router.patch("/keys/{key_id}")
    async def update(key_id: str, request: Request) -> Response:
        change: KeyUpdate = await _body(request, KeyUpdate)
        for name in sorted(change.model_fields_set - _NULLABLE):
            if getattr(change, name) is None:
                # null is no value for these (an `aliases: null` read as "every alias" would
                # widen the key): leave the field out to keep it, or give its empty value.
                raise bad_request(
                    f"{name}: may not be null (leave it out to keep it)",
                    param=name,
                    code="invalid_key_spec",
                )
        rec = await _change(key_id, gov.keys.update(key_id, change))
        assert isinstance(rec, KeyRecord)
        return _json(rec.public())

    @router.post("/keys/{key_id}/rotate")
    async def rotate(key_id: str) -> Response:
        out = await _change(key_id, gov.keys.rotate(key_id))
        assert isinstance(out, tuple)
        rec, secret = out
        return _json({**rec.public(), "key": secret})

    @router.post("/keys/{key_id}/revoke")
    async def revoke(key_id: str) -> Response:
        rec = await _change(key_id, gov.keys.revoke(key_id))
        assert isinstance(rec, KeyRecord)
        return _json(rec.public())

    @router.get("/spend")
    async def spend(request: Request) -> Response:
        q = query_params(request, _SPEND_QUERY)
        group_by = q.get("group_by") or "day"
        if group_by not in GROUPS:
            raise bad_request(
                f"'group_by' must be one of {', '.join(GROUPS)}.",
                param="group_by",
                code="invalid_query",
            )
        today = dt.datetime.now(dt.UTC).date()
        start = _day(q.get("from"), today - dt.timedelta(days=29), "from")
        end = _day(q.get("to"), today, "to")
        if end < start or (end - start).days >= MAX_DAYS:
            raise bad_request(
                f"'from'..'to' must span 1 to {MAX_DAYS} days.", param="from", code="invalid_query"
            )
        tenant, key, alias = q.get("tenant"), q.get("key"), q.get("alias")
        days = [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
        try:
            doc = await gov.ledger.query(days, tenant, key, alias, group_by)
        except (RedisError, OSError):
            raise GatewayError(
                503,
                "Spend counters are unreachable (Redis).",
                type="server_error",
                code="spend_store_unavailable",
            ) from None
        return _json({"from": days[0], "to": days[-1], **doc})

    @router.get("/usage")
    async def usage(request: Request) -> Response:
        query_params(request, frozenset())
        return _json(usage_view(gov, runtime))

    return router


def usage_view(gov: GovernanceService, runtime: Runtime) -> dict[str, Any]:
    """Per tenant: each limit with what is left (this process's view) and budgets spent."""
    g = runtime.snapshot.policy.governance
    now_m, now = time.monotonic(), time.time()
    tenants = set(g.tenants) | {t for t, _ in gov.stats.series if t != "other"}
    out = []
    for name in sorted(tenants):
        policy = g.tenant(name)
        scope = "t:" + name
        limits = []
        for dim, per_min in (
            ("requests", policy.limits.requests_per_minute),
            ("tokens", policy.limits.tokens_per_minute),
        ):
            if per_min:
                b = gov.limiter.bucket(scope, dim[0], per_min)
                limits.append(
                    {
                        "name": f"{dim}_per_minute",
                        "limit": per_min,
                        "remaining": int(b.remaining(now_m)),
                    }
                )
        if policy.limits.max_concurrent:
            s = gov.concurrency.slots(scope, policy.limits.max_concurrent)
            limits.append({"name": "concurrent", "limit": s.limit, "in_flight": s.inflight})
        budgets = []
        for period, usd in policy.budget.periods():
            spent = gov.ledger.spent(gov.ledger.budget_key(scope, period, now)) / NANO
            budgets.append(
                {
                    "period": period,
                    "limit_usd": usd,
                    "soft_usd": usd * policy.budget.soft_fraction,
                    "spent_usd": spent,
                }
            )
        counters = [c for (t, _), c in gov.stats.series.items() if t == name]
        out.append(
            {
                "tenant": name,
                "limits": limits,
                "budgets": budgets,
                "admitted": sum(c.admitted for c in counters),
                "refused": sum(
                    c.refused_rate_limit + c.refused_concurrency + c.refused_budget
                    for c in counters
                ),
                "cost_usd": sum(c.cost_nano for c in counters) / NANO,
            }
        )
    return {
        "tenants": out,
        "local_mode": gov.limiter.local_mode or gov.concurrency.local_mode,
        "processes": gov.procs.count,
    }
