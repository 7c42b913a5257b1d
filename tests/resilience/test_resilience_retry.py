"""Retry only where allowed, 429 cool-downs, the breaker state machine and fallback chains.

Counts are read at the simulator (`fleet.stats`), which sees every request the gateway really sent.
"""

from __future__ import annotations

import time

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import MSG, poll, requests_at, validate, validate_sse

pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


FLEET = [
    "a",
    "b",
    "c",
    "d",
    {"name": "small", "profile": "fast", "overrides": {"context_window": 64}},
]


def providers(fleet: Fleet, *names: str, breaker: str = "") -> str:
    extra = f", breaker: {breaker}" if breaker else ""
    return "\n".join(
        f"  {n}: {{base_url: '{fleet.url(n)}', timeouts: {{connect_s: 2, first_byte_s: 5, "
        f"total_s: 10}}{extra}}}"
        for n in names
    )


def two_member_policy(fleet: Fleet, breaker: str = "", resume: bool = False) -> str:
    return f"""
providers:
{providers(fleet, "a", "b", breaker=breaker)}
pools:
  main: {{members: [a, b], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main, resume: {str(resume).lower()}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
"""


def counts(fleet: Fleet, *names: str) -> dict[str, int]:
    return {n: requests_at(fleet, n) for n in names}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {n: after[n] - before[n] for n in before}


# -- what is retried, where ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_5xx_is_retried_on_a_different_member(fleet: Fleet, gateway, stream) -> None:
    gw = gateway(two_member_policy(fleet))
    fleet.set_faults("a", error_rate=1.0, error_status=[500])
    before = counts(fleet, "a", "b")
    for _ in range(4):
        r = gw.chat(stream=stream)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "b"
    moved = delta(before, counts(fleet, "a", "b"))
    assert moved["b"] == 4
    assert 1 <= moved["a"] <= 4  # a is tried, fails once per attempt, never twice in one request
    failures = [f for ctx in gw.seen for f in ctx.failures]
    assert failures and all(f == "a:upstream_5xx" for f in failures), failures


def test_connect_error_is_retried_on_a_different_member(fleet: Fleet, gateway) -> None:
    gw = gateway(two_member_policy(fleet))
    fleet.set_faults("a", refuse_connections=True)
    for stream in (False, True):
        r = gw.chat(stream=stream)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "b"
    kinds = {f for ctx in gw.seen for f in ctx.failures}
    assert kinds <= {"a:connect_error"}


@pytest.mark.parametrize("status", [400, 422])
def test_client_errors_pass_through_unretried(fleet: Fleet, gateway, status) -> None:
    gw = gateway(two_member_policy(fleet))
    fleet.set_faults("a", error_rate=1.0, error_status=[status])
    fleet.set_faults("b", error_rate=1.0, error_status=[status])
    direct = openai.OpenAI(base_url=fleet.url("a"), api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as upstream:
        direct.chat.completions.create(model="m", messages=MSG)
    before = counts(fleet, "a", "b")
    r = gw.chat()
    assert r.status_code == status
    assert r.json() == upstream.value.response.json()  # unchanged
    assert sum(delta(before, counts(fleet, "a", "b")).values()) == 1
    assert gw.breaker("a")["window_failures"] == 0 and gw.breaker("b")["window_failures"] == 0


def test_context_overflow_at_the_provider_is_not_retried(fleet: Fleet, gateway) -> None:
    gw = gateway(
        f"""
providers:
{providers(fleet, "small", "a")}
pools:
  main: {{members: [small, a], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main}}
"""
    )
    long = [{"role": "user", "content": "word " * 200}]
    before = counts(fleet, "small", "a")
    r = gw.chat(messages=long)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert delta(before, counts(fleet, "small", "a")) == {"small": 1, "a": 0}


def test_stream_cut_without_resume_ends_with_an_error_event(fleet: Fleet, gateway) -> None:
    gw = gateway(two_member_policy(fleet))
    fleet.set_faults("a", cut_stream_after_chunks=3)
    fleet.set_faults("b", cut_stream_after_chunks=3)
    before = counts(fleet, "a", "b")
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    received = []
    with pytest.raises(openai.APIError) as err:
        for chunk in client.chat.completions.create(
            model="chat", messages=MSG, max_tokens=20, stream=True
        ):
            validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
            received.append(chunk)
    assert "broke" in str(err.value)
    assert received and received[-1].choices[0].finish_reason is None  # no fake "stop"
    assert sum(delta(before, counts(fleet, "a", "b")).values()) == 1  # no second request
    poll(lambda: gw.seen)  # a stream is recorded once the server side has ended
    assert [f.split(":")[1] for ctx in gw.seen for f in ctx.failures] == ["stream_broken"]
    assert gw.seen[-1].status == 502


# -- 429 and cool-downs ---------------------------------------------------------------------------


def test_429_with_retry_after_cools_the_member_down(fleet: Fleet, gateway) -> None:
    gw = gateway(two_member_policy(fleet))
    fleet.set_faults("a", rate_limit=1.0, retry_after_s=1)
    before = counts(fleet, "a", "b")
    first = gw.chat()
    assert first.status_code == 200 and first.headers["x-gateway-provider"] == "b"
    cooled_at = time.monotonic()
    assert gw.breaker("a")["cooldown_remaining_s"] > 0.5
    assert gw.breaker("a")["state"] == "closed"  # a rate limit is not a health failure
    fleet.clear_faults("a")
    while time.monotonic() - cooled_at < 0.8:
        r = gw.chat()
        assert r.status_code == 200 and r.headers["x-gateway-provider"] == "b"
    assert delta(before, counts(fleet, "a", "b"))["a"] == 1  # only the request that got the 429
    time.sleep(max(0.0, 1.05 - (time.monotonic() - cooled_at)))
    providers_seen = {gw.chat().headers["x-gateway-provider"] for _ in range(4)}
    assert "a" in providers_seen  # back in rotation after Retry-After


def test_all_members_cooling_down_says_when_to_retry(fleet: Fleet, gateway) -> None:
    gw = gateway(two_member_policy(fleet))
    fleet.set_faults("a", rate_limit=1.0, retry_after_s=3)
    fleet.set_faults("b", rate_limit=1.0, retry_after_s=3)
    r = gw.chat()
    assert r.status_code in (429, 503)
    assert int(r.headers["retry-after"]) >= 2
    before = counts(fleet, "a", "b")
    r = gw.chat()  # nothing is sent while both cool down; the answer still says how long
    assert r.status_code in (429, 503), r.text
    validate("ErrorResponse", r.json())
    assert 1 <= int(r.headers["retry-after"]) <= 3
    assert "cool" in r.json()["error"]["message"]
    assert delta(before, counts(fleet, "a", "b")) == {"a": 0, "b": 0}


# -- breaker state machine ---------------------------------------------------------------------------


def test_breaker_trips_probes_and_closes_over_http(fleet: Fleet, gateway) -> None:
    gw = gateway(two_member_policy(fleet, breaker="{consecutive_failures: 3, cooldown_s: 0.5}"))
    fleet.set_faults("a", error_rate=1.0, error_status=[503])
    for _ in range(8):
        assert gw.chat().status_code == 200
        if gw.breaker("a")["state"] == "open":
            break
    assert gw.breaker("a")["state"] == "open"
    opened = time.monotonic()
    before = counts(fleet, "a", "b")
    while time.monotonic() - opened < 0.35:  # open: no traffic at all
        assert gw.chat().headers["x-gateway-provider"] == "b"
    assert delta(before, counts(fleet, "a", "b"))["a"] == 0

    # After the cool-down one probe goes to a; it fails again: open again, doubled cool-down.
    poll(lambda: gw.breaker("a")["state"] == "half_open", within_s=2)
    assert gw.chat().status_code == 200
    assert gw.breaker("a")["state"] == "open"
    assert requests_at(fleet, "a") == before["a"] + 1
    assert gw.breaker("a")["open_remaining_s"] > 0.6  # 2 x 0.5 s

    # Healthy again: the next probe succeeds and closes the breaker; a takes traffic again.
    fleet.clear_faults("a")
    poll(lambda: gw.breaker("a")["state"] == "half_open", within_s=3)
    r = gw.chat()
    assert r.status_code == 200 and r.headers["x-gateway-provider"] == "a"  # the probe
    assert gw.breaker("a")["state"] == "closed"
    assert "a" in {gw.chat().headers["x-gateway-provider"] for _ in range(4)}


# -- fallback chains ---------------------------------------------------------------------------------


def test_pool_to_pool_fallback(fleet: Fleet, gateway) -> None:
    gw = gateway(
        f"""
providers:
{providers(fleet, "a", "b", "c")}
pools:
  first: {{members: [a, b], fallback: [second]}}
  second: {{members: [c]}}
models:
  chat: {{pool: first}}
"""
    )
    fleet.set_faults("a", error_rate=1.0, error_status=[502])
    fleet.set_faults("b", refuse_connections=True)
    for stream in (False, True):
        r = gw.chat(stream=stream)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-pool"] == "second"
        assert r.headers["x-gateway-provider"] == "c"
        if stream:
            validate_sse(r.content)
        else:
            validate("CreateChatCompletionResponse", r.json())


def test_alias_to_alias_fallback_on_context_window(fleet: Fleet, gateway) -> None:
    gw = gateway(
        f"""
providers:
{providers(fleet, "a", "c")}
pools:
  short: {{members: [a]}}
  long: {{members: [c]}}
models:
  chat: {{pool: short, context_window: 100, fallback_alias: chat-long}}
  chat-long: {{pool: long, context_window: 100000}}
  strict: {{pool: short, context_window: 100}}
"""
    )
    long = [{"role": "user", "content": "many words " * 100}]
    before = counts(fleet, "a", "c")
    r = gw.chat(messages=long)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-pool"] == "long"
    assert delta(before, counts(fleet, "a", "c")) == {"a": 0, "c": 1}  # rerouted before sending

    r = gw.chat(model="strict", messages=long)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "100 tokens" in error["message"]
    assert delta(before, counts(fleet, "a", "c")) == {"a": 0, "c": 1}


# -- stale keep-alive connections ---------------------------------------------------------------------


class ClosingUpstream:
    """Answers the first request of each connection (keep-alive), then closes that connection
    without a response when a second request arrives on it: a server whose idle timeout raced
    the client's reuse of the connection."""

    ANSWER = (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":'
        b'[{"index":0,"message":{"role":"assistant","content":"ok","refusal":null},'
        b'"finish_reason":"stop","logprobs":null}]}'
    )

    def __init__(self) -> None:
        import asyncio
        import threading

        self.answered = 0
        self.closed_unanswered = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve() -> None:
            self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(serve()))
        ready.wait(5)

    async def _read_request(self, reader) -> bool:  # type: ignore[no-untyped-def]
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        return True

    async def _conn(self, reader, writer) -> None:  # type: ignore[no-untyped-def]
        import contextlib

        with contextlib.suppress(Exception):
            await self._read_request(reader)
            # counted before it is sent: the client may read the answer (and the test the
            # count) before this loop's thread runs again after `drain`
            self.answered += 1
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(self.ANSWER)).encode()
                + b"\r\n\r\n"
                + self.ANSWER
            )
            await writer.drain()
            await self._read_request(reader)
            self.closed_unanswered += 1
        writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_stale_keep_alive_connection_is_resent_once(gateway) -> None:
    upstream = ClosingUpstream()
    try:
        gw = gateway(
            f"""
providers:
  only: {{base_url: 'http://127.0.0.1:{upstream.port}/v1'}}
pools:
  main: {{members: [only]}}
models:
  chat: {{pool: main}}
"""
        )
        for _ in range(4):
            r = gw.chat()
            assert r.status_code == 200, r.text
        assert upstream.answered == 4
        assert upstream.closed_unanswered >= 1  # the reused connections really were dropped
        assert gw.runtime.snapshot.providers["only"].client.stale_resends >= 1
        assert gw.breaker("only")["window_failures"] == 0
        assert len(gw.seen) == 4 and all(not ctx.failures for ctx in gw.seen)
    finally:
        upstream.close()
