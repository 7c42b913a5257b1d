"""Gateway API keys -> tenants. Keys are compared by SHA-256; plaintext is never stored in a policy.

All key parsing lives here. Auth fails closed: a configured key source that yields no key
(an unset `key_env`, an empty `GATEWAY_API_KEYS` entry) is a start-up error naming the source,
never an open gateway.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from gateway.errors import unauthorized
from gateway.policy.schema import Auth

OPEN_TENANT = "default"
API_KEYS_ENV = "GATEWAY_API_KEYS"


class KeyConfigError(ValueError):
    """A key source that cannot be used; the message names the field or variable."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_api_keys(text: str, source: str = API_KEYS_ENV) -> list[tuple[str, str]]:
    """`tenant:key,tenant:key` -> [(tenant, key)]. The key is everything after the FIRST colon
    (keys may contain colons); an entry without a tenant, or with an empty key, is refused."""
    out: list[tuple[str, str]] = []
    for i, item in enumerate(s.strip() for s in text.split(",")):
        if not item:
            continue
        tenant, sep, key = item.partition(":")
        tenant, key = tenant.strip(), key.strip()
        if not sep:
            raise KeyConfigError(
                f"{source} entry {i + 1}: no tenant; write entries as 'tenant:key'"
            )
        if not tenant:
            raise KeyConfigError(f"{source} entry {i + 1}: empty tenant name before ':'")
        if not key:
            raise KeyConfigError(f"{source} entry {i + 1} (tenant '{tenant}'): empty key")
        out.append((tenant, key))
    return out


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header; None when absent or empty."""
    if not authorization or authorization[:7].lower() != "bearer ":
        return None
    key = authorization[7:].strip()
    return key or None


class KeyRing:
    """Looks up the tenant of a bearer key. Empty ring = open gateway (every caller is 'default')."""

    def __init__(self, auth: Auth, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._tenants: dict[str, str] = {}
        for i, k in enumerate(auth.keys):
            if k.key_sha256:
                self._tenants[k.key_sha256] = k.tenant
                continue
            value = env.get(k.key_env or "", "").strip()
            if not value:
                raise KeyConfigError(
                    f"auth.keys.{i}.key_env: environment variable {k.key_env} is unset or empty "
                    f"(tenant '{k.tenant}' would have no key)"
                )
            self._tenants[hash_key(value)] = k.tenant
        for tenant, key in parse_api_keys(env.get(API_KEYS_ENV, "")):
            self._tenants[hash_key(key)] = tenant

    @property
    def open(self) -> bool:
        return not self._tenants

    def tenant_for(self, authorization: str | None) -> str:
        if not self._tenants:
            return OPEN_TENANT
        key = bearer_key(authorization)
        if key is None:
            raise unauthorized("Missing API key. Send it as 'Authorization: Bearer <key>'.")
        tenant = self._tenants.get(hash_key(key))
        if tenant is None:
            raise unauthorized("Incorrect API key provided.")
        return tenant
