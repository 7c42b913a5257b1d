"""A web page of another origin cannot make the gateway act (cross-site request forgery).

A browser sends a "simple" cross-origin POST (a text/plain or form body, no custom header)
without any preflight, and the gateway used to act on it: any site a user visited could spend an
open gateway's provider credit, or drain members, open breakers and reload the policy through
the admin API that a gateway without an admin key serves to loopback callers. Such requests
(marked by `Sec-Fetch-Site`, or by an `Origin` of another host than `Host` in older browsers)
with a body type a browser sends without a preflight are now a 403 in the API's shape, recorded once, and never reach a provider; same-origin pages
(the dashboard), clients that are not browsers and safe methods are unaffected.

Live: a gateway over the project's simulators, raw HTTP as a browser writes it, the official
`openai` and `anthropic` clients.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from loadtests.simulator.testing import run_fleet
from tests.support import AccessLines, GatewayServer, environment, policy, requests_at

CHAT = '{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
MESSAGES = '{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}'
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Any]:
    with run_fleet([{"name": "a", "profile": "fast"}, {"name": "b", "profile": "fast"}]) as f:
        yield f


@pytest.fixture(scope="module")
def gw(fleet: Any) -> Iterator[GatewayServer]:
    # An open gateway with the admin API on loopback: what `gateway serve` runs by default.
    with (
        environment(GATEWAY_ADMIN_KEY=None, GATEWAY_API_KEYS=None),
        GatewayServer(policy(fleet)) as server,
    ):
        yield server


@pytest.fixture()
def access() -> Iterator[AccessLines]:
    lines = AccessLines()
    logger = logging.getLogger("gateway.access")
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)


def _browser(
    gw: GatewayServer, method: str, path: str, body: str, **headers: str
) -> httpx.Response:
    """A request as a browser sends it from a page: a simple content type, its own headers."""
    h = {"content-type": "text/plain;charset=UTF-8", **headers}
    return httpx.request(method, gw.url + path, content=body, headers=h)


def _chat_total(fleet: Any) -> int:
    return requests_at(fleet, "a") + requests_at(fleet, "b")


# Every way a browser marks a request from another origin.
CROSS: dict[str, dict[str, str]] = {
    "other-site": {"origin": EVIL, "sec-fetch-site": "cross-site"},
    "same-site-other-port": {"origin": "http://127.0.0.1:3000", "sec-fetch-site": "same-site"},
    "old-browser-origin-only": {"origin": EVIL},
    "old-browser-other-port": {"origin": "http://127.0.0.1:3000"},
    "sandboxed-null-origin": {"origin": "null"},
    "fetch-metadata-only": {"sec-fetch-site": "cross-site"},
}


@pytest.mark.parametrize("how", sorted(CROSS))
def test_a_cross_origin_inference_request_is_refused_before_any_provider(
    gw: GatewayServer, fleet: Any, access: AccessLines, how: str
) -> None:
    before = _chat_total(fleet)
    rid = f"csrf-{how}"
    r = _browser(gw, "POST", "/v1/chat/completions", CHAT, **CROSS[how], **{"x-request-id": rid})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "cross_origin_refused"
    assert r.headers["x-request-id"] == rid
    line = access.wait_for(rid, status=403)
    assert line["endpoint"] == "chat"
    assert sum(1 for x in access.lines if x["request_id"] == rid) == 1
    # The Messages API answers in Anthropic's shape.
    m = _browser(gw, "POST", "/v1/messages", MESSAGES, **CROSS[how])
    assert m.status_code == 403
    assert m.json()["type"] == "error" and m.json()["error"]["type"] == "permission_error"
    for path in ("/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/gateway/explain"):
        assert _browser(gw, "POST", path, "{}", **CROSS[how]).status_code == 403, path
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert (
        _browser(gw, "POST", "/v1/chat/completions", CHAT, **CROSS[how], **form).status_code == 403
    )
    no_type = httpx.post(gw.base_url + "/chat/completions", content=CHAT, headers=CROSS[how])
    assert no_type.status_code == 403
    assert _chat_total(fleet) == before


@pytest.mark.parametrize("how", sorted(CROSS))
def test_a_cross_origin_page_cannot_drive_the_loopback_admin_api(
    gw: GatewayServer, how: str
) -> None:
    for path in (
        "/admin/members/a/drain",
        "/admin/members/a/breaker",
        "/admin/reload",
        "/admin/keys",
    ):
        r = _browser(gw, "POST", path, '{"state":"open","tenant":"t"}', **CROSS[how])
        assert r.status_code == 403, (path, r.text)
    members = {m["name"]: m for m in httpx.get(gw.url + "/admin/members").json()["members"]}
    assert not members["a"]["drained"]
    assert members["a"]["breaker"]["state"] == "closed"


def test_same_origin_pages_clients_and_safe_methods_still_work(
    gw: GatewayServer, fleet: Any
) -> None:
    # The dashboard posting to its own origin: the Origin names the Host it addresses.
    own = {"origin": gw.url, "sec-fetch-site": "same-origin"}
    assert _browser(gw, "POST", "/admin/members/b/drain", "", **own).status_code == 200
    assert _browser(gw, "POST", "/admin/members/b/undrain", "", **own).status_code == 200
    legacy = {"origin": gw.url}  # a browser without fetch metadata
    assert _browser(gw, "POST", "/v1/chat/completions", CHAT, **legacy).status_code == 200
    # A user typing the address (`none`) and clients that send neither header.
    assert _browser(
        gw, "POST", "/v1/chat/completions", CHAT, **{"sec-fetch-site": "none"}
    ).is_success
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    out = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert out.choices[0].message.content
    ac = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    assert ac.messages.create(
        model="chat",
        max_tokens=4,
        messages=[{"role": "user", "content": "hi"}],  # type: ignore[arg-type]
    ).content
    # A request no browser sends without a preflight (JSON, a key) came from a client that chose
    # to send it (a desktop app's own fetch): not refused.
    json_req = httpx.post(
        gw.base_url + "/chat/completions",
        content=CHAT,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer x",
            **CROSS["other-site"],
        },
    )
    assert json_req.status_code == 200, json_req.text
    # Reading is not refused (a cross-origin page cannot read the answer anyway).
    assert httpx.get(gw.base_url + "/models", headers={"origin": EVIL}).status_code == 200
