"""Fixtures of the governance tests: a gateway whose keys are managed through /admin/keys."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer


def two_aliases(url: str) -> str:
    """`chat` and `other`, on pools of their own, over one member at ``url``."""
    return f"""
providers:
  p: {{base_url: '{url}', models: {{'*': sim}}}}
pools:
  main: {{members: [p]}}
  secret-pool: {{members: [p]}}
models:
  chat: {{pool: main}}
  other: {{pool: secret-pool}}
"""


@pytest.fixture
def managed(
    gateway: Callable[..., GatewayServer],
    redis_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], GatewayServer]:
    """A gateway for a policy text, with no static keys: keys come from /admin/keys (Redis)."""
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    return lambda policy: gateway(policy, redis_url=redis_url)


@pytest.fixture
def two_alias_gw(fleet: Fleet, managed: Callable[[str], GatewayServer]) -> GatewayServer:
    return managed(two_aliases(fleet.url("a")))
