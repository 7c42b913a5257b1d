"""Connections that clients reset must not stay pinned by uvicorn's keep-alive timer."""

from __future__ import annotations

import gc
import socket
import struct
import time

from gateway.http.protocol import GatewayHttpProtocol
from tests.http.test_api import policy_for

REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _live_protocols() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, GatewayHttpProtocol))


def _reset_after_response(port: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    assert data.startswith(b"HTTP/1.1 200")
    # SO_LINGER 0: close() sends RST, as a client that drops its connection does.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_reset_connections_are_released_at_once(fleet, gateway) -> None:
    gw = gateway(policy_for(fleet))
    before = _live_protocols()
    for _ in range(20):
        _reset_after_response(gw.port)
    deadline = time.monotonic() + 2.0  # well inside uvicorn's 5 s keep-alive timeout
    while _live_protocols() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_protocols() <= before
