"""Admin API guard: `Authorization: Bearer $GATEWAY_ADMIN_KEY`; without a key, loopback only."""

from __future__ import annotations

import hmac
import os

from starlette.requests import Request

from gateway.errors import GatewayError

_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def require_admin(request: Request) -> None:
    key = os.environ.get("GATEWAY_ADMIN_KEY")
    if key:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise GatewayError(401, "Admin API key required.", code="invalid_admin_key")
        return
    host = request.client.host if request.client else ""
    if host not in _LOOPBACK:
        raise GatewayError(
            403,
            "Admin API is loopback-only until GATEWAY_ADMIN_KEY is set.",
            code="admin_forbidden",
        )
