"""Gateway API keys -> tenants. Keys are compared by SHA-256; plaintext is never stored in a policy."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from gateway.errors import unauthorized
from gateway.policy.schema import Auth

OPEN_TENANT = "default"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Looks up the tenant of a bearer key. Empty ring = open gateway (every caller is 'default')."""

    def __init__(self, auth: Auth, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._tenants: dict[str, str] = {}
        for k in auth.keys:
            if k.key_sha256:
                self._tenants[k.key_sha256] = k.tenant
            elif k.key_env and env.get(k.key_env):
                self._tenants[hash_key(env[k.key_env])] = k.tenant
        extra = env.get("GATEWAY_API_KEYS", "")
        for item in filter(None, (s.strip() for s in extra.split(","))):
            tenant, _, key = item.rpartition(":")
            self._tenants[hash_key(key)] = tenant or OPEN_TENANT

    @property
    def open(self) -> bool:
        return not self._tenants

    def tenant_for(self, authorization: str | None) -> str:
        if not self._tenants:
            return OPEN_TENANT
        if not authorization or not authorization.lower().startswith("bearer "):
            raise unauthorized("Missing API key. Send it as 'Authorization: Bearer <key>'.")
        tenant = self._tenants.get(hash_key(authorization[7:].strip()))
        if tenant is None:
            raise unauthorized("Incorrect API key provided.")
        return tenant
