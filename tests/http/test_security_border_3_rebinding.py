"""The loopback-only admin API cannot be reached through a re-pointed host name (DNS rebinding).

Without GATEWAY_ADMIN_KEY the admin API (the dashboard's data) and `/metrics` trust loopback callers.
A web page on a domain that an attacker re-points to 127.0.0.1 is, to the browser, the same
origin as the gateway: its requests come from loopback and it reads the answers (members,
spend, a managed key created and its secret). Its `Host` names the attacker's domain; such
requests are now a 403 unless they carry the admin key. Live over the project's simulators.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import run_fleet
from tests.support import GatewayServer, environment, policy

EVIL = "rebind.evil.example"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Any]:
    with run_fleet([{"name": "a", "profile": "fast"}]) as f:
        yield f


@pytest.fixture(scope="module")
def gw(fleet: Any) -> Iterator[GatewayServer]:
    with (
        environment(GATEWAY_ADMIN_KEY=None, GATEWAY_API_KEYS=None),
        GatewayServer(policy(fleet)) as server,
    ):
        yield server


def _as(gw: GatewayServer, host: str, method: str, path: str, **kw: Any) -> httpx.Response:
    """A request from loopback that names `host` in its Host header, as a browser on a page of
    that origin sends it."""
    origin = f"http://{host}:{gw.port}"
    headers = {
        "host": f"{host}:{gw.port}",
        "origin": origin,
        "sec-fetch-site": "same-origin",
        **kw.pop("headers", {}),
    }
    return httpx.request(method, gw.url + path, headers=headers, **kw)


# What a loopback caller may use without a key.
TRUSTED = [
    ("GET", "/admin/members", None),
    ("GET", "/admin/keys", None),
    ("GET", "/admin/spend", None),
    ("GET", "/admin/usage", None),
    ("GET", "/admin/stats", None),
    ("GET", "/metrics", None),
    ("POST", "/admin/keys", {"tenant": "t"}),
    ("POST", "/admin/members/a/drain", None),
]


@pytest.mark.parametrize(("method", "path", "body"), TRUSTED)
def test_a_rebound_host_name_cannot_use_the_loopback_admin_api(
    gw: GatewayServer, method: str, path: str, body: Any
) -> None:
    r = _as(gw, EVIL, method, path, json=body)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "admin_forbidden"
    assert "sk-gw-" not in r.text
    # Nothing happened: no key created, the member not drained.
    keys = httpx.get(gw.url + "/admin/keys").json()
    assert not keys.get("keys"), keys
    members = httpx.get(gw.url + "/admin/members").json()["members"]
    assert not members[0]["drained"]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", "app.localhost"])
def test_loopback_names_still_reach_it(gw: GatewayServer, host: str) -> None:
    for method, path, _ in TRUSTED:
        if method == "GET":
            assert _as(gw, host, method, path).status_code == 200, (host, path)


def test_the_admin_key_decides_whatever_the_name(
    gw: GatewayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "adm-key-0123456789")
    key = {"authorization": "Bearer adm-key-0123456789"}
    assert _as(gw, EVIL, "GET", "/admin/members", headers=key).status_code == 200
    assert _as(gw, EVIL, "GET", "/admin/members").status_code == 401


def test_the_api_is_served_under_any_name_to_clients_that_are_not_browsers(
    gw: GatewayServer,
) -> None:
    """A reverse proxy or an SDK names any host; a browser page under a re-pointed name is
    refused on the open API too (tests/http/test_security_border_4_rebinding_open.py)."""
    headers = {"host": f"{EVIL}:{gw.port}"}
    assert httpx.get(gw.url + "/v1/models", headers=headers).status_code == 200
    assert _as(gw, EVIL, "GET", "/health").status_code == 200
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(gw.url + "/v1/chat/completions", headers=headers, json=chat)
    assert r.status_code == 200
    assert _as(gw, EVIL, "GET", "/v1/models").status_code == 403


def test_public_metrics_are_served_under_any_name(fleet: Any) -> None:
    with (
        environment(GATEWAY_ADMIN_KEY=None, GATEWAY_API_KEYS=None),
        GatewayServer(policy(fleet, metrics={"public": True})) as gw,
    ):
        assert _as(gw, EVIL, "GET", "/metrics").status_code == 200
        assert _as(gw, EVIL, "GET", "/admin/members").status_code == 403
