"""The client border over real loopback HTTP: whatever a client sends, it gets an error in its
API's shape with the right status (never a 500), and the request gets exactly one access-log
line and one metrics observation, with the status that was sent.

The gateway runs as `gateway serve` does (tests.support.GatewayServer: the same ASGI entry and
HTTP protocol), over simulated providers; the official `openai` and `anthropic` clients where
they can send the request, raw sockets where no client would.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.http.protocol import MAX_HEAD_BYTES, configure_connections
from gateway.policy.schema import Server
from loadtests.simulator.testing import Fleet
from tests.support import AccessLines, GatewayServer, validate

FLEET: list[Any] = ["a"]
KEY = {"authorization": "Bearer key-a"}
MSG: list[Any] = [{"role": "user", "content": "hi"}]


def _policy(fleet: Fleet, server: str = "") -> str:
    return f"""
{server}
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim-a}}, simulated: true}}
pools:
  main: {{members: [a]}}
models:
  chat: {{pool: main, cache: {{exact: {{ttl_s: 600}}}}}}
"""


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEWAY_API_KEYS", "team-a:key-a")
        with GatewayServer(_policy(fleet)) as server:
            yield server


@pytest.fixture
def oa(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)


@pytest.fixture
def an(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)


def rid() -> str:
    return uuid.uuid4().hex


def requests_total(gw: GatewayServer) -> float:
    total = 0.0
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith("gateway_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def recorded_once(
    gw: GatewayServer, log: AccessLines, request_id: str, status: int
) -> dict[str, Any]:
    """The request's one access-log line (with `status`) and its one observation."""
    line = log.wait_for(request_id, status=status)
    time.sleep(0.05)  # a second line or observation would come now
    assert [x["request_id"] for x in log.lines].count(request_id) == 1
    assert [c.status for c in gw.seen if c.request_id == request_id] == [status]
    return line


def is_openai_error(body: bytes) -> dict[str, Any]:
    doc = orjson.loads(body)
    validate("ErrorResponse", doc)
    return doc["error"]


def is_anthropic_error(body: bytes) -> dict[str, Any]:
    doc = orjson.loads(body)
    assert doc["type"] == "error" and isinstance(doc["error"]["message"], str), doc
    return doc["error"]


def raw_exchange(port: int, data: bytes, within_s: float = 5.0) -> bytes:
    """Send `data` (as far as the gateway reads it), then everything it answers until it closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=within_s)
    try:
        # Closed by the gateway before it all went: its answer is still there.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out
    finally:
        s.close()


def split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


# -- B1: completions prompts ----------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [[None], [1.5], [{"a": 1}], [[]], [-1], [True], ["a", 1]])
def test_a_prompt_of_no_schema_shape_is_a_400_naming_it(
    gw: GatewayServer, oa: openai.OpenAI, access_log: AccessLines, prompt: Any
) -> None:
    request_id = rid()
    with pytest.raises(openai.BadRequestError) as raised:
        oa.completions.create(
            model="chat", prompt=prompt, extra_headers={"x-request-id": request_id}
        )
    assert raised.value.body["param"].startswith("prompt")  # type: ignore[index]
    recorded_once(gw, access_log, request_id, 400)
    explained = httpx.post(
        gw.url + "/v1/gateway/explain", json={"model": "chat", "prompt": prompt}, headers=KEY
    )
    assert explained.status_code == 400
    assert is_openai_error(explained.content)["param"].startswith("prompt")


def test_every_prompt_shape_of_the_schema_is_served(oa: openai.OpenAI) -> None:
    # (A batch of token lists is accepted too: tests/wire; the simulator does not take it.)
    for prompt in ("hi", ["hi", "there"], [1, 2, 3]):
        assert oa.completions.create(model="chat", prompt=prompt, max_tokens=2).choices


# -- B2: client headers read as numbers -----------------------------------------------------------


@pytest.mark.parametrize("ttl", [b"\xb2", b"1\xb9", b"\xbd", "\u0663".encode()])
def test_a_cache_ttl_of_non_ascii_digits_is_ignored_on_every_api(
    gw: GatewayServer, ttl: bytes
) -> None:
    headers: dict[str, Any] = {**KEY, "x-gateway-cache-ttl": ttl}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"messages": MSG, "temperature": 0, "max_tokens": 3}),
        ("/v1/completions", {"prompt": "hi", "temperature": 0, "max_tokens": 3}),
        ("/v1/embeddings", {"input": "hi"}),
        ("/v1/messages", {"messages": MSG, "temperature": 0, "max_tokens": 3}),
        ("/v1/responses", {"input": "hi", "temperature": 0, "max_output_tokens": 16}),
    ]
    for path, body in calls:
        r = httpx.post(gw.url + path, json={"model": "chat", **body}, headers=headers)
        assert r.status_code == 200, (path, r.text)


# -- B3: the request head's size ------------------------------------------------------------------


def test_a_request_head_beyond_64_kib_gets_431_and_a_closed_connection(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    before = requests_total(gw)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: "
    data = raw_exchange(gw.port, head + b"a" * (32 * 1024 * 1024))  # one 32 MiB header
    status, headers, body = split(data)
    assert status == 431 and headers["connection"] == "close"
    assert is_openai_error(body)["code"] == "request_header_fields_too_large"
    line = recorded_once(gw, access_log, headers["x-request-id"], 431)
    assert line["endpoint"] == "chat"
    assert requests_total(gw) == before + 1


def test_many_headers_count_too_and_the_messages_api_gets_its_own_shape(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(1000))  # ~110 KiB
    data = raw_exchange(gw.port, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    status, headers, body = split(data)
    assert status == 431
    assert is_anthropic_error(body)["type"] == "request_too_large"
    assert recorded_once(gw, access_log, headers["x-request-id"], 431)["endpoint"] == "messages"


def test_trailers_are_dropped_and_bounded(gw: GatewayServer) -> None:
    """Trailer fields after a chunked body are not kept (200 MiB of them were, with the
    headers): a few pass unread, more than a head's worth end the connection."""
    body = b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer key-a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    chunked = b"%x\r\n%s\r\n0\r\n" % (len(body), body)
    status, _, _ = split(raw_exchange(gw.port, head + chunked + b"X-T: 1\r\n\r\n"))
    assert status == 200
    trailers = b"X-T: " + b"A" * 8000 + b"\r\n"
    out = raw_exchange(gw.port, head + chunked + trailers * 100 + b"\r\n")  # ~800 KB
    assert not out.startswith(b"HTTP/1.1 200"), out[:200]


def test_a_head_just_under_the_limit_and_a_trickled_one_are_served(gw: GatewayServer) -> None:
    big = {f"x-pad-{i}": "p" * 1000 for i in range((MAX_HEAD_BYTES - 4096) // 1020)}
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "chat", "messages": MSG, "max_tokens": 2},
        headers={**KEY, **big},
    )
    assert r.status_code == 200
    # A normal request arriving in small pieces (several reads per head) is not refused.
    body = orjson.dumps({"model": "chat", "messages": MSG, "max_tokens": 2})
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
        b"Connection: close\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    for i in range(0, len(request), 16):
        s.sendall(request[i : i + 16])
        time.sleep(0.001)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    assert out.startswith(b"HTTP/1.1 200")


def test_pipelined_requests_are_not_mistaken_for_a_large_head(gw: GatewayServer) -> None:
    body = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "x" * 40_000}]})
    one = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    last = one.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    data = raw_exchange(gw.port, one + one + last, within_s=10)
    assert data.count(b"HTTP/1.1 200") == 3, data[:300]


def test_an_unparsable_request_is_a_json_400_and_recorded(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    status, headers, body = split(raw_exchange(gw.port, b"NOT HTTP AT ALL\r\n\r\n"))
    assert status == 400 and is_openai_error(body)["code"] == "invalid_http_request"
    recorded_once(gw, access_log, headers["x-request-id"], 400)


# -- B4: body timeouts and disconnects on /v1/messages --------------------------------------------


@pytest.fixture
def slow_gw(fleet: Fleet, gateway: Callable[..., GatewayServer]) -> Iterator[GatewayServer]:
    yield gateway(_policy(fleet, "server: {body_timeout_s: 0.4, header_timeout_s: 0.4}"))
    # The limits are per process: later in-process gateways get the defaults back.
    configure_connections(Server())  # type: ignore[call-arg]


def _partial(path: str, request_id: str | None, body: bytes) -> bytes:
    rid_header = b"x-request-id: %s\r\n" % request_id.encode() if request_id else b""
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nx-api-key: key-a\r\nAuthorization: Bearer key-a\r\n"
        b"content-type: application/json\r\n"
        b"%scontent-length: %d\r\n\r\n%s" % (path.encode(), rid_header, len(body) + 50, body)
    )


@pytest.mark.parametrize(
    ("path", "shape", "endpoint"),
    [
        ("/v1/messages", is_anthropic_error, "messages"),
        ("/v1/messages/count_tokens", is_anthropic_error, "messages.count_tokens"),
        ("/v1/chat/completions", is_openai_error, "chat"),
        ("/v1/responses", is_openai_error, "responses"),
    ],
)
@pytest.mark.parametrize("client_id", [True, False])
def test_a_body_timeout_is_a_408_in_the_apis_shape_with_its_request_id(
    slow_gw: GatewayServer,
    access_log: AccessLines,
    path: str,
    shape: Callable[[bytes], dict[str, Any]],
    endpoint: str,
    client_id: bool,
) -> None:
    request_id = rid() if client_id else None
    started = time.monotonic()
    data = raw_exchange(slow_gw.port, _partial(path, request_id, b'{"model": "chat"'))
    assert time.monotonic() - started < 3.0
    status, headers, body = split(data)
    assert status == 408 and headers["connection"] == "close"
    shape(body)
    if request_id is not None:
        assert headers["x-request-id"] == request_id
    line = recorded_once(slow_gw, access_log, headers["x-request-id"], 408)
    assert line["endpoint"] == endpoint


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_client_gone_mid_body_is_recorded_as_499(
    gw: GatewayServer, access_log: AccessLines, path: str
) -> None:
    request_id = rid()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.sendall(_partial(path, request_id, b'{"model": "chat"'))
    time.sleep(0.2)
    s.close()
    recorded_once(gw, access_log, request_id, 499)


# -- B5: depth on every API, Responses metadata -----------------------------------------------------

DEEP = "[" * 200 + "]" * 200


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        (
            "/v1/messages",
            '{"model":"chat","max_tokens":3,"messages":[{"role":"user","content":"hi"}],'
            f'"metadata":{{"a":{DEEP}}}}}',
            is_anthropic_error,
        ),
        (
            "/v1/messages/count_tokens",
            f'{{"model":"chat","messages":[{{"role":"user","content":"hi"}}],"x":{DEEP}}}',
            is_anthropic_error,
        ),
        (
            "/v1/responses",
            f'{{"model":"chat","input":"hi","metadata":{{"a":{DEEP}}}}}',
            is_openai_error,
        ),
        (
            "/v1/chat/completions",
            f'{{"model":"chat","messages":[{{"role":"user","content":"hi"}}],"x":{DEEP}}}',
            is_openai_error,
        ),
    ],
)
def test_json_depth_is_bounded_on_every_api(
    gw: GatewayServer,
    access_log: AccessLines,
    path: str,
    body: str,
    shape: Callable[[bytes], dict[str, Any]],
) -> None:
    request_id = rid()
    r = httpx.post(gw.url + path, content=body, headers={**KEY, "x-request-id": request_id})
    assert r.status_code == 400
    assert "nested more than 64 levels" in shape(r.content)["message"]
    recorded_once(gw, access_log, request_id, 400)


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({"k": 1}, "metadata.k"),
        ({"k": "v" * 513}, "metadata.k"),
        ({f"k{i}": "v" for i in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata"),
        ("text", "metadata"),
    ],
)
def test_responses_metadata_out_of_bounds_is_a_400(
    oa: openai.OpenAI, metadata: Any, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        oa.responses.create(model="chat", input="hi", metadata=metadata)
    assert raised.value.body["param"] == param  # type: ignore[index]


def test_responses_metadata_in_bounds_is_echoed_and_stored(oa: openai.OpenAI) -> None:
    meta = {f"k{i}": "v" * 512 for i in range(16)}
    created = oa.responses.create(model="chat", input="hi", metadata=meta, max_output_tokens=16)
    assert created.metadata == meta
    assert oa.responses.retrieve(created.id).metadata == meta


# -- B6: every request recorded once; routing errors in the API's shape ----------------------------


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "endpoint", "shape"),
    [
        ("GET", "/v1/nothing-here", KEY, 404, "unknown", is_openai_error),
        ("POST", "/v1/chat/completions/", KEY, 404, "unknown", is_openai_error),
        ("PUT", "/v1/chat/completions", KEY, 405, "chat", is_openai_error),
        ("GET", "/v1/messages", {"x-api-key": "key-a"}, 405, "messages", is_anthropic_error),
        (
            "GET",
            "/v1/messages/count_tokens",
            {"x-api-key": "key-a"},
            405,
            "messages.count_tokens",
            is_anthropic_error,
        ),
        ("GET", "/v1/messages/nope", {}, 404, "unknown", is_anthropic_error),
        ("GET", "/v1/models", KEY, 200, "models.list", None),
        ("GET", "/v1/models", {"authorization": "Bearer wrong"}, 401, "models.list", None),
        ("GET", "/v1/models/chat", KEY, 200, "models.retrieve", None),
        ("GET", "/v1/models/nope", KEY, 404, "models.retrieve", is_openai_error),
        ("GET", "/v1/models/chat", {}, 401, "models.retrieve", is_openai_error),
        ("POST", "/v1/gateway/explain", KEY, 200, "explain", None),
        ("POST", "/v1/gateway/explain", {}, 401, "explain", is_openai_error),
        ("GET", "/v1/gateway/deferred/abc", KEY, 404, "deferred", is_openai_error),
        ("GET", "/v1/gateway/deferred/abc", {}, 401, "deferred", is_openai_error),
    ],
)
def test_every_route_is_logged_and_counted_once(
    gw: GatewayServer,
    access_log: AccessLines,
    method: str,
    path: str,
    headers: dict[str, str],
    status: int,
    endpoint: str,
    shape: Callable[[bytes], dict[str, Any]] | None,
) -> None:
    before = requests_total(gw)
    request_id = rid()
    body = {"model": "chat", "messages": MSG} if method == "POST" else None
    r = httpx.request(
        method, gw.url + path, json=body, headers={**headers, "x-request-id": request_id}
    )
    assert r.status_code == status and r.headers["x-request-id"] == request_id
    if shape is not None:
        shape(r.content)
    line = recorded_once(gw, access_log, request_id, status)
    assert line["endpoint"] == endpoint
    if status != 401 and endpoint in ("models.list", "models.retrieve", "explain", "deferred"):
        assert line["tenant"] == "team-a"  # authenticated: the line names who asked
    assert requests_total(gw) == before + 1


def test_the_anthropic_client_reads_the_method_error(gw: GatewayServer) -> None:
    an = anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        an.get("/v1/messages", cast_to=object)
    assert raised.value.status_code == 405
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


# -- B7 and the minor fields -----------------------------------------------------------------------


def test_both_token_limits_are_checked(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        oa.chat.completions.create(
            model="chat", messages=MSG, max_completion_tokens=3, extra_body={"max_tokens": "lots"}
        )
    assert raised.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_an_unknown_content_part_type_is_a_400(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        oa.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": [{"type": "foo", "text": "x"}]}],  # type: ignore[list-item,misc]
        )
    assert raised.value.body["param"] == "messages[0].content[0].type"  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"top_k": "x"}, "top_k"),
        ({"temperature": 1.5}, "temperature"),  # Anthropic's range is 0..1
        ({"top_p": "high"}, "top_p"),
        ({"metadata": {"user_id": 5}}, "metadata.user_id"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "should be a valid string",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
                    },
                ]
            },
            "input",
        ),
    ],
)
def test_messages_fields_a_chat_provider_never_sees_are_still_checked(
    an: anthropic.Anthropic, fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:
        # extra_body: fields this SDK version does not type (top_k), or types otherwise.
        an.messages.create(model="chat", max_tokens=5, messages=MSG, extra_body=fields)  # type: ignore[arg-type]
    message = raised.value.body["error"]["message"]  # type: ignore[index]
    assert words in message and "not supported" not in message


def test_a_huge_model_name_is_not_echoed_whole(oa: openai.OpenAI, an: anthropic.Anthropic) -> None:
    model = "m" * 100_000
    with pytest.raises(openai.NotFoundError) as raised:
        oa.chat.completions.create(model=model, messages=MSG)
    assert len(raised.value.body["message"]) < 600  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as not_found:
        an.messages.create(model=model, max_tokens=3, messages=MSG)  # type: ignore[arg-type]
    assert len(not_found.value.body["error"]["message"]) < 600  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as counted:
        an.messages.count_tokens(model=model, messages=MSG)  # type: ignore[arg-type]
    assert len(counted.value.body["error"]["message"]) < 600  # type: ignore[index]


def test_anthropic_stop_sequences_are_not_held_to_chat_s_four(gw: GatewayServer) -> None:
    """A Messages request keeps Anthropic's own limits once translated: six stop sequences
    are fine there (chat allows four), and a document part is a provider extension chat lets
    through."""
    an = anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)
    stops = [f"STOP{i}" for i in range(6)]
    m = an.messages.create(
        model="chat",
        max_tokens=3,
        stop_sequences=stops,
        messages=[{"role": "user", "content": "hi"}],
    )
    assert m.type == "message"
    part = {"type": "document_url", "document_url": "https://example.com/a.pdf"}
    r = httpx.post(
        gw.base_url + "/chat/completions",
        headers=KEY,
        json={"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": [part]}]},
    )
    assert r.status_code == 200, r.text  # before: 400 on messages[0].content[0].type
