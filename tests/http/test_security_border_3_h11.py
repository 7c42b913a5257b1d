"""`gateway serve --http h11`: an unparsable request is answered in the API's error shape and
recorded once, as with the default parser.

uvicorn's h11 protocol answered a request it could not parse with a bare `text/plain` line that
no access-log line or metrics count recorded: a client could send any number of them unseen.
Live: the protocol `gateway serve --http h11` runs, raw sockets.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.cli import _http_protocol
from loadtests.simulator.testing import run_fleet
from tests.support import AccessLines, GatewayServer, policy, poll


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with (
        run_fleet([{"name": "a", "profile": "fast"}]) as fleet,
        GatewayServer(policy(fleet), http=_http_protocol("h11")) as server,
    ):
        yield server


def _send(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


# Request heads h11 refuses, each a different parser error.
BAD: dict[str, bytes] = {
    "garbage": b"GARBAGE\r\n\r\n",
    "bad-header": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n",
    "two-lengths": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    b"content-length: 5\r\ncontent-length: 6\r\n\r\nhello",
    "space-before-colon": b"GET /health HTTP/1.1\r\nhost : x\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_unparsable_request_gets_a_json_error_and_one_record(
    gw: GatewayServer, name: str
) -> None:
    access = AccessLines()
    logger = logging.getLogger("gateway.access")
    logger.addHandler(access)
    try:
        seen = len(gw.seen)
        out = _send(gw.port, BAD[name])
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), out
        assert b"content-type: application/json" in head.lower()
        err: dict[str, Any] = orjson.loads(body)["error"]
        assert err["code"] == "invalid_http_request"
        request_id = next(
            line.split(b":", 1)[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-request-id:")
        )
        line = access.wait_for(request_id, status=400)
        assert line["endpoint"] == "unknown"
        poll(lambda: len(gw.seen) > seen)
        assert len(gw.seen) == seen + 1  # one record: the access log and the metrics
    finally:
        logger.removeHandler(access)


def test_good_requests_still_pass(gw: GatewayServer) -> None:
    out = _send(gw.port, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out
    assert gw.chat().status_code == 200
