"""A re-pointed web page cannot spend an open gateway's credit; GATEWAY_ALLOWED_HOSTS.

Without client keys (GATEWAY_API_KEYS unset: the open /v1 of local development) a gateway on
loopback answered anyone on this machine, and a web page whose domain an attacker re-points to
127.0.0.1 (DNS rebinding) is such a caller: to the browser it is same-origin, so it could POST
chat completions and read them, on the operator's provider credit. Its `Host` still names the
attacker's domain: a browser's request (it sends `Origin` or `Sec-Fetch-*`) under a name that is
not a loopback one is now a 403 `rebinding_refused` in the API's shape. Clients that are not
browsers (SDKs, curl, a reverse proxy on this machine forwarding its public `Host`) still work.

GATEWAY_ALLOWED_HOSTS lists the names the gateway serves (`*.domain` wildcards; loopback names
always): any other `Host` is a 403 `host_not_allowed` on every path but the health probes, and
its names are also the ones browsers may use on an open gateway. A bad entry stops the start.

Live over the project's simulators: the official openai client for what is served, raw httpx
and sockets with chosen headers for what is refused. Each refusal is recorded exactly once.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.http.hosts import HostsConfigError
from gateway.http.server import build_app
from loadtests.simulator.testing import run_fleet
from tests.support import AccessLines, GatewayServer, environment, policy, requests_at

EVIL = "rebind.evil.example"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
# The inference routes a re-pointed page could spend credit on, with a body each accepts.
SPENDING = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "chat", "prompt": "hi", "max_tokens": 4},
    "/v1/embeddings": {"model": "chat", "input": "hi"},
    "/v1/responses": {"model": "chat", "input": "hi", "max_output_tokens": 16},
    "/v1/messages": MESSAGES,
}
# How browsers mark their requests (a same-origin page: what a rebound page is).
BROWSER: dict[str, dict[str, str]] = {
    "origin-and-fetch-metadata": {"origin": "ORIGIN", "sec-fetch-site": "same-origin"},
    "origin-only": {"origin": "ORIGIN"},
    "sec-fetch-site-only": {"sec-fetch-site": "same-origin"},
    "sec-fetch-mode-only": {"sec-fetch-mode": "cors"},
}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Any]:
    with run_fleet([{"name": "a", "profile": "fast"}]) as f:
        yield f


@pytest.fixture(scope="module")
def open_gw(fleet: Any) -> Iterator[GatewayServer]:
    with (
        environment(GATEWAY_ADMIN_KEY=None, GATEWAY_API_KEYS=None, GATEWAY_ALLOWED_HOSTS=None),
        GatewayServer(policy(fleet)) as server,
    ):
        yield server


@pytest.fixture(scope="module")
def listed_gw(fleet: Any) -> Iterator[GatewayServer]:
    env = {"GATEWAY_ALLOWED_HOSTS": " api.example.com, *.corp.example ,10.0.0.7,[fd00::1]"}
    with (
        environment(GATEWAY_ADMIN_KEY=None, GATEWAY_API_KEYS=None),
        GatewayServer(policy(fleet), env=env) as server,
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


def _as(gw: GatewayServer, host: str, method: str, path: str, **kw: Any) -> httpx.Response:
    """A request from loopback naming `host` (with the gateway's port) in its Host header."""
    headers = {"host": f"{host}:{gw.port}", **kw.pop("headers", {})}
    return httpx.request(method, gw.url + path, headers=headers, timeout=10, **kw)


def _browser_headers(how: str, gw: GatewayServer, host: str) -> dict[str, str]:
    return {k: v.replace("ORIGIN", f"http://{host}:{gw.port}") for k, v in BROWSER[how].items()}


def _recorded_once(gw: GatewayServer, access: AccessLines, rid: str, status: int) -> None:
    """One access-log line and one record (what the metrics observe) for the request."""
    access.wait_for(rid, status=status)
    assert sum(1 for x in access.lines if x["request_id"] == rid) == 1
    assert sum(1 for c in gw.seen if c.request_id == rid) == 1


def _client(gw: GatewayServer, host: str | None = None) -> openai.OpenAI:
    headers = {"host": host} if host else None
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, default_headers=headers)


def _chat(client: openai.OpenAI) -> str:
    out = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,  # type: ignore[arg-type]
    )
    return out.choices[0].message.content or ""


# -- the open API behind a re-pointed name -------------------------------------------------------


@pytest.mark.parametrize("how", sorted(BROWSER))
def test_a_rebound_page_cannot_spend_the_open_gateways_credit(
    open_gw: GatewayServer, fleet: Any, access: AccessLines, how: str
) -> None:
    before = requests_at(fleet, "a")
    headers = _browser_headers(how, open_gw, EVIL)
    for path, body in SPENDING.items():
        rid = f"rebind-{how}{path.replace('/', '-')}"
        r = _as(open_gw, EVIL, "POST", path, json=body, headers={**headers, "x-request-id": rid})
        assert r.status_code == 403, (path, r.text)
        if path == "/v1/messages":  # Anthropic's shape
            assert r.json()["type"] == "error"
            assert r.json()["error"]["type"] == "permission_error"
            message = r.json()["error"]["message"]
        else:
            err = r.json()["error"]
            assert (err["code"], err["type"]) == ("rebinding_refused", "permission_error")
            message = err["message"]
        assert "GATEWAY_ALLOWED_HOSTS" in message and "GATEWAY_API_KEYS" in message
        _recorded_once(open_gw, access, rid, 403)
    # Reading is refused too: a same-origin page reads every answer.
    assert _as(open_gw, EVIL, "GET", "/v1/models", headers=headers).status_code == 403
    assert requests_at(fleet, "a") == before


def test_clients_that_are_not_browsers_keep_working(open_gw: GatewayServer) -> None:
    # The SDK on its own address, and a reverse proxy on this machine forwarding a public Host.
    assert _chat(_client(open_gw))
    assert _chat(_client(open_gw, "api.example.com"))
    proxied = _as(open_gw, "api.example.com", "POST", "/v1/chat/completions", json=CHAT)
    assert proxied.status_code == 200, proxied.text
    # A proxy rewriting the client's address does not make a page's request look remote.
    spoofed = {"x-forwarded-for": "203.0.113.9", "origin": f"http://{EVIL}:{open_gw.port}"}
    r = _as(open_gw, EVIL, "POST", "/v1/chat/completions", json=CHAT, headers=spoofed)
    assert r.status_code == 403


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", "app.localhost", "[::1]"])
def test_pages_on_loopback_names_still_use_the_open_api(open_gw: GatewayServer, host: str) -> None:
    headers = _browser_headers("origin-and-fetch-metadata", open_gw, host)
    r = _as(open_gw, host, "POST", "/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 200, r.text


def test_with_client_keys_the_key_decides(fleet: Any) -> None:
    with (
        environment(GATEWAY_API_KEYS="t:sk-test-0123456789", GATEWAY_ALLOWED_HOSTS=None),
        GatewayServer(policy(fleet)) as gw,
    ):
        headers = _browser_headers("origin-and-fetch-metadata", gw, EVIL)
        r = _as(gw, EVIL, "POST", "/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401, r.text
        keyed = {**headers, "authorization": "Bearer sk-test-0123456789"}
        r = _as(gw, EVIL, "POST", "/v1/chat/completions", json=CHAT, headers=keyed)
        assert r.status_code == 200, r.text


# -- GATEWAY_ALLOWED_HOSTS ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "api.example.com",
        "API.Example.COM.",  # case and a trailing dot
        "x.corp.example",
        "a.b.corp.example",
        "10.0.0.7",
        "[fd00::1]",
        "localhost",  # loopback names always
        "127.0.0.1",
        "[::1]",
    ],
)
def test_listed_names_are_served(listed_gw: GatewayServer, host: str) -> None:
    assert _chat(_client(listed_gw, f"{host}:{listed_gw.port}"))
    # Browsers too: the operator named the host (a page behind their own proxy).
    headers = {"origin": "https://app.example.com", "sec-fetch-site": "same-site"}
    r = _as(listed_gw, host, "POST", "/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 200, r.text
    r = httpx.post(listed_gw.base_url + "/chat/completions", json=CHAT, headers={"host": host})
    assert r.status_code == 200, r.text  # without a port


@pytest.mark.parametrize("host", [EVIL, "corp.example", "xcorp.example", "api.example.com.evil"])
def test_other_names_are_refused_everywhere_but_health(
    listed_gw: GatewayServer, fleet: Any, access: AccessLines, host: str
) -> None:
    before = requests_at(fleet, "a")
    rid = f"host-{host}"
    r = _as(
        listed_gw, host, "POST", "/v1/chat/completions", json=CHAT, headers={"x-request-id": rid}
    )
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "host_not_allowed"
    assert "GATEWAY_ALLOWED_HOSTS" in r.json()["error"]["message"]
    _recorded_once(listed_gw, access, rid, 403)
    m = _as(listed_gw, host, "POST", "/v1/messages", json=MESSAGES)
    assert m.status_code == 403 and m.json()["error"]["type"] == "permission_error"
    for path in ("/v1/models", "/admin/members", "/metrics", "/"):
        assert _as(listed_gw, host, "GET", path).status_code == 403, path
    for path in ("/health", "/ready"):
        assert _as(listed_gw, host, "GET", path).status_code == 200, path
    assert requests_at(fleet, "a") == before


def _raw_status(gw: GatewayServer, host: bytes | None) -> int:
    """The status of a GET /v1/models with exactly these Host bytes (or none, HTTP/1.0)."""
    head = b"GET /v1/models HTTP/1.0\r\n" if host is None else b"GET /v1/models HTTP/1.1\r\n"
    if host is not None:
        head += b"Host: " + host + b"\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(head + b"Connection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.mark.parametrize(
    "host",
    [
        b"a" * 20_000,  # far past any name
        b"api.example.com" + b"." * 300,
        b"api.example.com\xff",
        b"\xc3\xa4pi.example.com",
        b"[::1",  # unclosed bracket
        b"[::1]x",
        b"api.example.com:99999999",
        b"api.example.com:80:80",
        b"api.example.com:",
        b"",
        b"api.example.com@evil.example",
        None,
    ],
)
def test_odd_host_values_are_refused_without_error(listed_gw: GatewayServer, host: bytes) -> None:
    status = _raw_status(listed_gw, host)
    assert status in (400, 403), status  # the HTTP parser may refuse some first
    assert _raw_status(listed_gw, b"api.example.com:443") == 200


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        ("api.example.com:8080", "api.example.com:8080"),
        ("*", "*"),
        ("http://api.example.com", "http://api.example.com"),
        ("api.example.com/v1", "api.example.com/v1"),
        ("ok.example, exa mple.com", "exa mple.com"),
        ("a..b", "a..b"),
        ("*.*.example.com", "*.*.example.com"),
        ("api.*.example.com", "api.*.example.com"),
        ("api.example.com,,other.example", ""),
        ("-bad.example", "-bad.example"),
    ],
)
def test_a_bad_entry_stops_the_start(value: str, bad: str) -> None:
    # Read before the policy is: nothing has started when it fails.
    with (
        environment(GATEWAY_POLICY="/nonexistent.yaml", GATEWAY_ALLOWED_HOSTS=value),
        pytest.raises(HostsConfigError, match="GATEWAY_ALLOWED_HOSTS entry") as e,
    ):
        build_app()
    assert repr(bad) in str(e.value), str(e.value)
