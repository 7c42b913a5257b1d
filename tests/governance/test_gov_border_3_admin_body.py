"""Admin request bodies are capped (1 MiB): a larger one is a 413 in the API's shape, by its
content-length before anything is read, or while it arrives without one. Real gateways on
loopback, real Redis.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from gateway.http.admin import MAX_ADMIN_BODY_BYTES
from tests.support import GatewayServer


@pytest.fixture
def gw(two_alias_gw: GatewayServer) -> GatewayServer:
    return two_alias_gw


def _raw_post(gw: GatewayServer, path: str, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send a request by hand; return what the gateway answered (read until it closes)."""
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n".encode() + head + b"\r\n")
        try:
            for part in body_parts:
                s.sendall(part)
        except OSError:
            pass  # the gateway answered and closed before the rest: what this test wants
        # The body is not finished: the answer comes while the client is still "sending".
        out = b""
        while b"\r\n\r\n" not in out or not out.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    return out


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/admin/keys"),
        ("PATCH", "/admin/keys/mk_0000000000000000"),
        ("POST", "/admin/members/p/breaker"),
    ],
)
def test_admin_bodies_over_the_cap_are_a_413(gw: GatewayServer, method: str, path: str) -> None:
    big = b'{"tenant": "' + b"x" * (MAX_ADMIN_BODY_BYTES + 10) + b'"}'
    r = httpx.request(
        method, gw.url + path, content=big, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large"
    # Without a length (chunked), refused once the cap is passed.
    r = httpx.request(
        method,
        gw.url + path,
        content=iter([big[i : i + 65536] for i in range(0, len(big), 65536)]),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert httpx.get(gw.url + "/admin/keys").json() == {"keys": []}


def test_a_huge_declared_admin_body_is_refused_before_it_is_sent(gw: GatewayServer) -> None:
    """A content-length of 10 GB is refused at once: nothing of it is waited for or read."""
    head = b"content-type: application/json\r\ncontent-length: 10000000000\r\n"
    out = _raw_post(gw, "/admin/keys", head, [b'{"tenant": "'])
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert b"request_too_large" in out
