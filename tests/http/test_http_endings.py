"""How a connection's requests end at the HTTP level, over real loopback sockets: a body the
parser refuses (a malformed chunk, trailers too large) is answered in the API's shape, a bad
request pipelined behind good ones does not lose them, and a client that half-closes after a
complete request still gets its answer. Each request is recorded once (one access-log line,
one metrics observation), with the status sent.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from loadtests.simulator.testing import Fleet
from tests.hostile import HostileUpstream
from tests.support import AccessLines, GatewayServer

FLEET: list[Any] = ["a"]
BODY = orjson.dumps(
    {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
)
AUTH = b"Authorization: Bearer key-a\r\n"
PORT: list[int] = [0]  # the port `exchange` talks to: this test's gateway


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    policy = f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim-a}}, simulated: true}}
pools:
  main: {{members: [a]}}
models:
  chat: {{pool: main}}
"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEWAY_API_KEYS", "team-a:key-a")
        with GatewayServer(policy) as server:
            yield server


@pytest.fixture(autouse=True)
def _port(request: pytest.FixtureRequest) -> None:
    name = "slow_gw" if "slow_gw" in request.fixturenames else "gw"
    PORT[0] = request.getfixturevalue(name).port


def request(
    path: bytes = b"/v1/chat/completions",
    body: bytes = BODY,
    extra: bytes = b"",
    version: bytes = b"HTTP/1.1",
) -> bytes:
    return (
        b"POST %s %s\r\nHost: x\r\nContent-Type: application/json\r\n%s%s"
        b"Content-Length: %d\r\n\r\n%s" % (path, version, AUTH, extra, len(body), body)
    )


def chunked_head(path: bytes = b"/v1/chat/completions") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
        b"Transfer-Encoding: chunked\r\n\r\n" % (path, AUTH)
    )


def exchange(data: bytes, half_close: bool = False, within_s: float = 5.0) -> bytes:
    """Send `data` (as far as the gateway reads it), optionally shut the sending side, then
    read everything until the gateway closes."""
    s = socket.create_connection(("127.0.0.1", PORT[0]), timeout=within_s)
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                out += chunk
        return out
    finally:
        s.close()


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The final responses in `data`, in order (interim 1xx responses skipped)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data[:200]
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
        if 100 <= status < 200:
            data = rest
            continue
        n = int(headers["content-length"])
        out.append((status, headers, rest[:n]))
        data = rest[n:]
    return out


def recorded_once(gw: GatewayServer, log: AccessLines, request_id: str, status: int) -> None:
    log.wait_for(request_id, status=status)
    time.sleep(0.1)  # a second line or observation would come now
    assert [x["request_id"] for x in log.lines].count(request_id) == 1
    assert [c.status for c in gw.seen if c.request_id == request_id] == [status]


def one_error(
    gw: GatewayServer, log: AccessLines, data: bytes, status: int, anthropic: bool = False
) -> dict[str, Any]:
    n = len(gw.seen)
    answers = responses(exchange(data))
    assert [a[0] for a in answers] == [status], answers
    _, headers, body = answers[0]
    assert headers["connection"] == "close"
    doc = orjson.loads(body)
    if anthropic:
        assert doc["type"] == "error" and isinstance(doc["error"]["message"], str), doc
    else:
        assert set(doc) == {"error"} and isinstance(doc["error"]["message"], str), doc
    recorded_once(gw, log, headers["x-request-id"], status)
    assert len(gw.seen) == n + 1
    return doc["error"]


# -- a body the parser refuses --------------------------------------------------------------------


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages", b"/v1/responses"])
def test_trailers_beyond_the_head_limit_get_431_in_the_apis_shape(
    gw: GatewayServer, access_log: AccessLines, path: bytes
) -> None:
    """Trailer fields larger than a head may be are refused with a 431 (they were a 499 with
    nothing answered: the connection was closed under the running request)."""
    chunked = b"%x\r\n%s\r\n0\r\n" % (len(BODY), BODY)
    trailers = (b"X-T: " + b"A" * 8000 + b"\r\n") * 100 + b"\r\n"
    err = one_error(
        gw, access_log, chunked_head(path) + chunked + trailers, 431, path == b"/v1/messages"
    )
    assert "trailer" in err["message"]


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nabc\r\n0\r\n\r\n",  # a chunk size that is not hexadecimal
        b'5\r\n{"mod\r\nzz\r\n',  # a good chunk, then a bad one
        b'5\r\n{"modXXXX\r\n0\r\n\r\n',  # a chunk longer than its size
        b"%x\r\n%s\r\n0\r\nno colon here\r\n\r\n" % (len(BODY), BODY),  # a malformed trailer
    ],
)
@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
def test_a_malformed_chunked_body_is_a_400_in_the_apis_shape(
    gw: GatewayServer, access_log: AccessLines, body: bytes, path: bytes
) -> None:
    """It was a 499 with no answer at all."""
    err = one_error(gw, access_log, chunked_head(path) + body, 400, path == b"/v1/messages")
    assert "chunked" in err["message"]


@pytest.mark.parametrize(
    ("framing", "status"),
    [
        (b"%x\r\n%s\r\n0\r\nX-T: " % (len(BODY), BODY), 431),  # one trailer line that never ends
        (b"%x\r\n%s\r\n0\r\n" % (len(BODY), BODY) + b"X: 1\r\n" * 20_000, 431),  # many
        (b"5;ext=", 400),  # a chunk extension that never ends
        (b"%x\r\n%s\r\n00000" % (len(BODY), BODY), 400),  # a chunk size of endless zeros
    ],
)
def test_chunked_framing_without_data_is_bounded_like_a_head(
    gw: GatewayServer, access_log: AccessLines, framing: bytes, status: int
) -> None:
    """Chunk lines, extensions and trailers bring no body byte: they were read without a bound
    until the body timeout (a 100 MB trailer line was buffered and copied over and over, 3 MB/s
    of CPU); beyond a head's size they are refused at once, in the API's shape."""
    request_id = f"framing-{time.monotonic_ns()}"
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    head = chunked_head().replace(
        b"\r\n\r\n", b"\r\nx-request-id: %s\r\n\r\n" % request_id.encode()
    )
    start = time.monotonic()
    out = b""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(head + framing)
        filler = (
            framing[-1:] * 65536
            if status == 400 or framing.endswith(b"X-T: ")
            else b"Y: 2\r\n" * 9000
        )
        for _ in range(200):  # up to ~13 MB more of the same
            s.sendall(filler)
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            out += chunk
    s.close()
    assert time.monotonic() - start < 5  # not the 30 s body timeout
    answers = responses(out)
    assert [a[0] for a in answers] == [status], out[:300]
    assert answers[0][1]["x-request-id"] == request_id
    recorded_once(gw, access_log, request_id, status)


def test_a_chunked_body_sent_a_byte_at_a_time_is_served(gw: GatewayServer) -> None:
    data = chunked_head() + b"".join(b"1\r\n%c\r\n" % c for c in BODY) + b"0\r\nX-T: 1\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(len(data)):
        s.send(data[i : i + 1])
    s.shutdown(socket.SHUT_WR)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    assert [a[0] for a in responses(out)] == [200]


def test_a_good_chunked_body_with_small_trailers_is_still_served(gw: GatewayServer) -> None:
    data = chunked_head() + b"%x\r\n%s\r\n0\r\nX-T: 1\r\n\r\n" % (len(BODY), BODY)
    answers = responses(exchange(data, half_close=True))
    assert [a[0] for a in answers] == [200]


# -- a bad request pipelined behind good ones -----------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),  # an unparsable head
        (chunked_head() + b"zz\r\n", 400),  # a malformed body
        (b"POST /v1/chat/completions HTTP/1.1\r\nX-Big: " + b"a" * 200_000, 431),  # a huge head
    ],
)
def test_a_bad_pipelined_request_does_not_lose_the_ones_before_it(
    gw: GatewayServer, access_log: AccessLines, bad: bytes, status: int
) -> None:
    """The good requests are answered in order, then the bad one; each recorded once (the
    connection was closed at once: the good requests were lost, recorded as 499)."""
    n = len(gw.seen)
    ids = [f"piped-{time.monotonic_ns()}-{i}".encode() for i in range(2)]
    good = b"".join(request(extra=b"x-request-id: %s\r\n" % i) for i in ids)
    answers = responses(exchange(good + bad))
    assert [a[0] for a in answers] == [200, 200, status], answers
    assert [a[1]["x-request-id"].encode() for a in answers[:2]] == ids
    for i in ids:
        recorded_once(gw, access_log, i.decode(), 200)
    recorded_once(gw, access_log, answers[2][1]["x-request-id"], status)
    assert len(gw.seen) == n + 3


# -- a client that half-closes --------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [b"", b"Connection: close\r\n", b"Expect: 100-continue\r\n"],
    ids=["keep", "close", "expect"],
)
def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    gw: GatewayServer, access_log: AccessLines, extra: bytes
) -> None:
    """shutdown(SHUT_WR) after a whole request: it was a 499 with nothing answered."""
    request_id = f"half-{time.monotonic_ns()}"
    data = request(extra=extra + b"x-request-id: %s\r\n" % request_id.encode())
    answers = responses(exchange(data, half_close=True))
    assert [a[0] for a in answers] == [200], answers
    assert orjson.loads(answers[0][2])["object"] == "chat.completion"
    recorded_once(gw, access_log, request_id, 200)


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
def test_pipelined_requests_then_a_half_close_are_all_answered(
    gw: GatewayServer, access_log: AccessLines, path: bytes
) -> None:
    body = BODY if path != b"/v1/messages" else BODY.replace(b'"max_tokens":2', b'"max_tokens":3')
    ids = [f"half-piped-{time.monotonic_ns()}-{i}" for i in range(3)]
    data = b"".join(request(path, body, b"x-request-id: %s\r\n" % i.encode()) for i in ids)
    answers = responses(exchange(data, half_close=True))
    assert [a[0] for a in answers] == [200, 200, 200], answers
    assert [a[1]["x-request-id"] for a in answers] == ids
    for i in ids:
        recorded_once(gw, access_log, i, 200)


def test_an_http_1_0_request_then_a_half_close_is_answered(gw: GatewayServer) -> None:
    out = exchange(request(version=b"HTTP/1.0"), half_close=True)
    assert b"100 Continue" not in out  # no interim response to an HTTP/1.0 client
    assert [a[0] for a in responses(out)] == [200]


def test_a_half_close_inside_a_head_is_a_400_and_inside_a_body_a_499(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    n = len(gw.seen)
    partial = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    answers = responses(exchange(partial, half_close=True))
    assert [a[0] for a in answers] == [400]
    recorded_once(gw, access_log, answers[0][1]["x-request-id"], 400)
    request_id = f"half-body-{time.monotonic_ns()}"
    data = request(extra=b"x-request-id: %s\r\n" % request_id.encode())[:-5]
    assert exchange(data, half_close=True) == b""  # cannot complete: nobody to answer
    recorded_once(gw, access_log, request_id, 499)
    assert len(gw.seen) == n + 2
    # An idle connection that half-closes is just closed (empty lines are no request).
    assert exchange(b"", half_close=True) == b""
    assert exchange(b"\r\n", half_close=True) == b""
    time.sleep(0.1)
    assert len(gw.seen) == n + 2


@pytest.fixture(scope="module")
def slow_gw() -> Iterator[GatewayServer]:
    with HostileUpstream() as upstream:
        policy = f"""
providers:
  s: {{base_url: '{upstream.url("slow")}', max_inflight: 4}}
pools:
  p: {{members: [s], max_attempts: 1}}
models:
  m: {{pool: p}}
"""
        with GatewayServer(policy) as g:
            yield g


def _slow_request(request_id: str) -> bytes:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
        b"x-request-id: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (AUTH, request_id.encode(), len(body), body)
    )


@pytest.mark.parametrize("later", [False, True], ids=["at-once", "after-half-close"])
def test_a_client_that_closes_altogether_while_waiting_is_still_a_499_at_once(
    slow_gw: GatewayServer, access_log: AccessLines, later: bool
) -> None:
    """A closed socket sends the same end of file as a half-close: the gateway tells them
    apart (a closed socket resets the interim response) and cancels the request, whether the
    client closed at once or half-closed first and left later."""
    request_id = f"closed-{int(later)}-{time.monotonic_ns()}"
    s = socket.create_connection(("127.0.0.1", slow_gw.port), timeout=5)
    s.sendall(_slow_request(request_id))
    time.sleep(0.2)
    start = time.monotonic()
    if later:
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.5)
    s.close()
    line = access_log.wait_for(request_id, within_s=2.8)
    assert line["status"] == 499
    assert time.monotonic() - start < 2.8  # the slow upstream answers after 3 s
    time.sleep(0.1)
    assert [x["request_id"] for x in access_log.lines].count(request_id) == 1


def test_a_half_closed_client_waiting_for_a_slow_answer_gets_it(
    slow_gw: GatewayServer, access_log: AccessLines
) -> None:
    request_id = f"half-slow-{time.monotonic_ns()}"
    out = exchange(_slow_request(request_id), half_close=True, within_s=10)
    assert out.count(b"HTTP/1.1 100 Continue") >= 2  # it was looked after while it waited
    answers = responses(out)
    assert [a[0] for a in answers] == [200], answers
    recorded_once(slow_gw, access_log, request_id, 200)


# -- a request asking for a protocol upgrade ------------------------------------------------------

WEBSOCKET = (
    b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)
H2C = b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"


@pytest.mark.parametrize("upgrade", [H2C, WEBSOCKET, b"Upgrade: foo/2\r\nConnection: upgrade\r\n"])
def test_a_request_asking_for_an_upgrade_is_served_over_http_1_1(
    gw: GatewayServer, access_log: AccessLines, upgrade: bytes
) -> None:
    """The gateway upgrades to nothing: the request is served as a plain one, its body
    included (it ran with an empty body, a 400), and a WebSocket handshake gets the route's
    answer (it was a bare 403 from the WebSocket layer, unrecorded)."""
    ids = [f"upgrade-{time.monotonic_ns()}-{i}" for i in range(3)]
    post = request(extra=upgrade + b"x-request-id: %s\r\n" % ids[0].encode())
    get = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n%s%sx-request-id: %s\r\n\r\n" % (
        AUTH,
        upgrade,
        ids[1].encode(),
    )
    chunked = chunked_head(b"/v1/messages").replace(
        b"\r\n\r\n",
        b"\r\n%santhropic-version: 2023-06-01\r\nx-request-id: %s\r\n\r\n"
        % (upgrade, ids[2].encode()),
    ) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    out = b""
    for data in (post, get, chunked):  # one at a time, then all three pipelined
        out += exchange(data, half_close=True)
    out += exchange(post + get + chunked, half_close=True)
    assert b"101 Switching" not in out
    answers = responses(out)
    assert [a[0] for a in answers] == [200] * 6, answers
    assert [a[1]["x-request-id"] for a in answers] == ids + ids
    assert orjson.loads(answers[0][2])["object"] == "chat.completion"
    assert orjson.loads(answers[1][2])["object"] == "list"
    assert orjson.loads(answers[2][2])["type"] == "message"
    for i in ids:
        access_log.wait_for(i)
    time.sleep(0.1)
    for i in ids:
        assert [x["status"] for x in access_log.lines if x["request_id"] == i] == [200, 200]


def test_a_body_split_across_reads_after_an_upgrade_head_is_read_whole(gw: GatewayServer) -> None:
    data = request(extra=H2C + b"Connection: close\r\n")
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    for piece in (data[:-20], data[-20:-7], data[-7:]):
        s.sendall(piece)
        time.sleep(0.05)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    assert [a[0] for a in responses(out)] == [200]


def test_many_pipelined_upgrade_requests_in_one_read_are_all_answered(gw: GatewayServer) -> None:
    one = b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: a\r\nConnection: upgrade\r\n\r\n"
    last = one.replace(b"upgrade\r\n", b"upgrade, close\r\n")
    answers = responses(exchange(one * 1500 + last, within_s=30))
    assert [a[0] for a in answers] == [200] * 1501


def test_a_pipelined_client_that_leaves_is_no_server_error(
    slow_gw: GatewayServer, access_log: AccessLines, caplog: pytest.LogCaptureFixture
) -> None:
    """The request being answered when a pipelining client leaves was not marked gone (only the
    last one read was): its app's quiet end was logged as an ASGI error and a 500 was written to
    the closed connection (an exception left in its task)."""
    caplog.set_level(logging.WARNING)
    request_id = f"piped-gone-{time.monotonic_ns()}"
    s = socket.create_connection(("127.0.0.1", slow_gw.port), timeout=5)
    s.sendall(_slow_request(request_id + "-1") + _slow_request(request_id + "-2"))
    time.sleep(0.4)
    s.close()
    assert access_log.wait_for(request_id + "-1", within_s=2.5)["status"] == 499
    time.sleep(0.3)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_a_reset_inside_a_head_is_recorded_once_and_an_empty_connection_not(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    """A client that resets its connection inside a request's head is recorded like one that
    closes it there (a 400), once; a connection reset before any request is nothing."""

    def reset_after(data: bytes) -> None:
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if data:
            s.sendall(data)
            time.sleep(0.1)
        s.close()

    n = len(gw.seen)
    reset_after(b"")
    reset_after(b"\r\n")
    time.sleep(0.2)
    assert len(gw.seen) == n
    reset_after(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Le")
    time.sleep(0.3)
    assert [(c.status, c.endpoint) for c in gw.seen[n:]] == [(400, "messages")]
    line = access_log.wait_for(gw.seen[n].request_id, status=400)
    assert line["endpoint"] == "messages"


# -- HTTP/1.0 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
def test_a_stream_to_an_http_1_0_client_is_not_chunked(
    gw: GatewayServer, access_log: AccessLines, path: bytes
) -> None:
    """HTTP/1.0 has no chunked encoding: the stream is sent as is and ends with the connection
    (it was chunked, chunk sizes in the middle of the events for an HTTP/1.0 client)."""
    request_id = f"http10-{time.monotonic_ns()}"
    body = BODY.replace(b'"max_tokens":2', b'"max_tokens":12,"stream":true')
    extra = b"x-request-id: %s\r\nanthropic-version: 2023-06-01\r\n" % request_id.encode()
    out = exchange(request(path, body, extra, version=b"HTTP/1.0"))
    head, _, payload = out.partition(b"\r\n\r\n")
    headers = head.lower()
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in headers
    assert b"connection: close" in headers and b"content-type: text/event-stream" in headers
    events = [e for e in payload.split(b"\n\n") if e]
    assert events and all(e.startswith((b"data: ", b"event: ")) for e in events), payload[:300]
    if path == b"/v1/messages":
        assert b"event: message_stop" in events[-1]
    else:
        assert events[-1] == b"data: [DONE]"
        assert orjson.loads(events[0][6:])["object"] == "chat.completion.chunk"
    recorded_once(gw, access_log, request_id, 200)


def test_an_http_1_0_answer_with_a_length_keeps_it(gw: GatewayServer) -> None:
    out = exchange(request(version=b"HTTP/1.0"))
    answers = responses(out)
    assert [a[0] for a in answers] == [200] and "transfer-encoding" not in answers[0][1]
    assert orjson.loads(answers[0][2])["object"] == "chat.completion"


# -- HEAD -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "endpoint"),
    [
        ("/health", None),
        ("/ready", None),
        ("/v1/models", "models.list"),
        ("/v1/models/chat", "models.retrieve"),
        ("/dashboard", None),
    ],
)
def test_head_is_served_wherever_get_is(
    gw: GatewayServer, access_log: AccessLines, path: str, endpoint: str | None
) -> None:
    """HTTP requires HEAD wherever GET is served: it was a 405 (a load balancer's `HEAD /health`
    marked the gateway down). Same status and headers, no body, recorded as the GET would be."""
    request_id = f"head-{time.monotonic_ns()}"
    headers = {"authorization": "Bearer key-a"}
    got = httpx.get(gw.url + path, headers=headers)
    head = httpx.head(gw.url + path, headers={**headers, "x-request-id": request_id})
    assert head.status_code == got.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
    time.sleep(0.2)
    mine = [(c.status, c.endpoint) for c in gw.seen if c.request_id == request_id]
    assert mine == ([] if endpoint is None else [(200, endpoint)])


def test_head_where_only_post_is_served_is_still_a_405(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    request_id = f"head-post-{time.monotonic_ns()}"
    r = httpx.head(gw.base_url + "/chat/completions", headers={"x-request-id": request_id})
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    recorded_once(gw, access_log, request_id, 405)
