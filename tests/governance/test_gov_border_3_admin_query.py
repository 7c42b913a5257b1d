"""Admin query parameters are typed and bounded: dates in full (a date followed by anything is not
one), group_by from its list, filters printable and at most 256 characters, each name at most once,
no unknown names; a malformed one is a 400 in the API's shape naming it, never a silently
different answer. Real gateways on loopback, real Redis.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support import GatewayServer


@pytest.fixture
def gw(two_alias_gw: GatewayServer) -> GatewayServer:
    return two_alias_gw


BAD_QUERIES: list[tuple[str, str, str]] = [
    ("/admin/spend", "from=2026-01-01garbage", "from"),
    ("/admin/spend", "to=2026-01-01T00:00:00", "to"),
    ("/admin/spend", "from=20260101", "from"),
    ("/admin/spend", "from=2026-W01-1", "from"),
    ("/admin/spend", "to=2026-13-01", "to"),
    ("/admin/spend", "from=%00", "from"),
    ("/admin/spend", "from=2026-01-01&from=2026-01-02", "from"),
    ("/admin/spend", "group_by=bogus", "group_by"),
    ("/admin/spend", "group_by=day&group_by=tenant", "group_by"),
    ("/admin/spend", "grup_by=tenant", "grup_by"),
    ("/admin/spend", "tenant=" + "x" * 5000, "tenant"),
    ("/admin/spend", "key=a%0Ab", "key"),
    ("/admin/spend", "alias=%1b[31m", "alias"),
    ("/admin/spend", "from=2020-01-01&to=2026-01-01", "from"),
    ("/admin/keys", "tenant=a%0Ab", "tenant"),
    ("/admin/keys", "tenant=a&tenant=b", "tenant"),
    ("/admin/keys", "tenat=a", "tenat"),
    ("/admin/policy", "full=garbage", "full"),
    ("/admin/policy", "full=true&full=false", "full"),
    ("/admin/usage", "x=1", "x"),
    ("/admin/members", "x=1", "x"),
]


@pytest.mark.parametrize(("path", "query", "param"), BAD_QUERIES)
def test_malformed_admin_queries_are_a_400_naming_the_parameter(
    gw: GatewayServer, path: str, query: str, param: str
) -> None:
    r = httpx.get(f"{gw.url}{path}?{query}")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_query"
    assert err["param"] == param
    assert len(r.text) < 1000  # a refused value is not echoed back whole


def test_well_formed_admin_queries_still_answer(gw: GatewayServer) -> None:
    ok = [
        ("/admin/spend", "from=2026-01-01&to=2026-01-31&group_by=tenant&tenant=t&key=k&alias=a"),
        ("/admin/spend", "from=&to="),
        ("/admin/spend", ""),
        ("/admin/keys", "tenant=team%2Bx"),
        ("/admin/policy", "full=true"),
        ("/admin/policy", "full=false"),
        ("/admin/usage", ""),
    ]
    for path, query in ok:
        r = httpx.get(f"{gw.url}{path}?{query}")
        assert r.status_code == 200, (path, query, r.text)
    spend = httpx.get(f"{gw.url}/admin/spend?from=2026-01-01&to=2026-01-03").json()
    assert (spend["from"], spend["to"]) == ("2026-01-01", "2026-01-03")


def test_path_values_are_echoed_bounded(gw: GatewayServer) -> None:
    """A member or key name in an admin path is echoed cut short and escaped, never whole."""
    name = "m" * 5000 + "%1b[31m"
    for method, path in (
        ("POST", f"/admin/members/{name}/drain"),
        ("POST", f"/admin/members/{name}/breaker"),
        ("GET", f"/admin/keys/{name}"),
    ):
        r = httpx.request(method, gw.url + path, json={"state": "open"})
        assert r.status_code == 404, r.text
        assert len(r.text) < 400 and "\x1b" not in r.text
