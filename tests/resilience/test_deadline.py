"""The request's deadline (`retry.deadline_s`, shortened by the `x-gateway-timeout` header) bounds
attempts, backoff waits, queue waits and hedges until the answer starts; a committed stream is not
cut by it.

One real gateway for the module, real simulators that hang or decode slowly, the official openai
and anthropic clients. The policy's deadline is 0.9 s and a member's first-byte limit 0.35 s: a
request to hanging members fails on two of them and is cut on the third.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.pipeline.deadline import header_seconds
from gateway.resilience import retry
from gateway.resilience.retry import Retrier, RetrySettings
from loadtests.simulator.testing import Fleet
from tests.support import AccessLines, GatewayServer, poll, requests_at, validate

DEADLINE_S = 0.9
MODEL_DEADLINE_S = 0.5  # `quick`'s own, shorter than the policy's
SLACK_S = 1.0  # a busy test machine: the bound checked is deadline + this
FLEET = [
    "a",
    "b",
    "c",
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 20, "decode_tps_full": 20},
    },
]
MEMBER = (
    "timeouts: {connect_s: 1, first_byte_s: 0.35, idle_s: 2, total_s: 5, unary_min_tps: 1000}, "
    "breaker: {consecutive_failures: 0, min_requests: 100000}"
)
RULES = """
rules:
  - name: deadline
    match: {keywords: [degrademe]}
    template: "Degraded: try again later."
"""
MSG = [{"role": "user", "content": "hello"}]

pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def policy(fleet: Fleet, rules: Path | None = None) -> str:
    degradation = f"degradation: {{rules: '{rules}'}}\n" if rules else ""
    return f"""
providers:
  a: {{base_url: '{fleet.url("a")}', {MEMBER}}}
  b: {{base_url: '{fleet.url("b")}', {MEMBER}}}
  c: {{base_url: '{fleet.url("c")}', {MEMBER}}}
  qa: {{base_url: '{fleet.url("a")}', max_inflight: 1,
        timeouts: {{first_byte_s: 3, total_s: 5}}}}
  slow: {{base_url: '{fleet.url("slow")}', timeouts: {{first_byte_s: 2, idle_s: 2, total_s: 10}}}}
pools:
  main: {{members: [a, b, c], balancer: {{strategy: round_robin}}}}
  hedged: {{members: [a, b], balancer: {{strategy: round_robin}},
            hedge: {{enabled: true, delay_ms: 50}}}}
  queued: {{members: [qa], queue: {{max_wait_s: 5}}}}
  slowpool: {{members: [slow]}}
models:
  chat: {{pool: main}}
  quick: {{pool: main, deadline_s: {MODEL_DEADLINE_S}}}
  hedged: {{pool: hedged}}
  queued: {{pool: queued}}
  slowchat: {{pool: slowpool}}
retry: {{max_attempts: 3, base_backoff_ms: 0, max_backoff_ms: 0, budget_ratio: 100,
         budget_min_per_s: 1000, deadline_s: {DEADLINE_S}}}
{degradation}"""


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


def hang(fleet: Fleet, *names: str) -> None:
    for name in names or ("a", "b", "c"):
        fleet.set_faults(name, hang=True)


def client(gw: GatewayServer, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", timeout=timeout, max_retries=0)


def post(
    gw: GatewayServer, headers: dict[str, str] | None = None, **body: Any
) -> tuple[httpx.Response, float]:
    """A chat request with httpx; (response, seconds it took). Waits for the gateway's record."""
    n = len(gw.seen)
    payload = {"model": "chat", "messages": MSG, "max_tokens": 8, **body}
    start = time.monotonic()
    r = httpx.post(
        gw.base_url + "/chat/completions", json=payload, headers=headers or {}, timeout=10
    )
    took = time.monotonic() - start
    poll(lambda: len(gw.seen) > n)
    return r, took


def assert_deadline_504(r: Any, source: str) -> None:
    """`r`: an httpx response (the openai client's own httpx build included)."""
    assert r.status_code == 504, r.text
    body = r.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "deadline_exceeded", body
    assert body["error"]["type"] == "timeout_error"
    assert source in body["error"]["message"], body


def requests_metric(gw: GatewayServer, status: int) -> float:
    """gateway_requests_total of alias chat with this status, summed, as /metrics shows it."""
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("gateway_requests_total{")
            and 'alias="chat"' in line
            and f'status="{status}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_retries_end_at_the_policy_deadline_with_one_record(
    fleet: Fleet, gw: GatewayServer, access_log: AccessLines
) -> None:
    hang(fleet)
    before = requests_metric(gw, 504)
    rid = f"deadline-{uuid.uuid4().hex[:8]}"
    n = len(gw.seen)
    start = time.monotonic()
    # The client's own limits (read timeout 5 s, x-gateway-timeout 60 s) are longer: they never
    # lengthen the policy's deadline.
    with pytest.raises(openai.APIStatusError) as caught:
        client(gw, timeout=5.0).chat.completions.create(
            model="chat",
            messages=MSG,  # type: ignore[arg-type]
            max_tokens=8,
            extra_headers={"x-request-id": rid, "x-gateway-timeout": "60"},
        )
    took = time.monotonic() - start
    assert DEADLINE_S <= took < DEADLINE_S + SLACK_S, took
    assert_deadline_504(caught.value.response, "retry.deadline_s")
    poll(lambda: len(gw.seen) > n)
    ctx = gw.seen[-1]
    # Normally 3 (0.35 s + 0.35 s + cut); a busy machine may leave time for only 2.
    assert ctx.status == 504 and ctx.attempts >= 2, (took, ctx.failures, ctx.attempts)
    assert f"after {ctx.attempts} attempts" in caught.value.response.json()["error"]["message"]
    # The ones before failed on their own first-byte limit; the last was cut, not failed.
    assert len(ctx.failures) == ctx.attempts - 1, ctx.failures
    assert len({f.split(":")[0] for f in ctx.failures}) == len(ctx.failures)
    assert all(f.endswith(":first_byte_timeout") for f in ctx.failures), ctx.failures
    line = access_log.wait_for(rid)
    assert line["status"] == 504
    time.sleep(0.05)  # a second line, were there one, would be written by now
    assert [x["request_id"] for x in access_log.lines].count(rid) == 1
    assert [c.request_id for c in gw.seen].count(rid) == 1
    assert requests_metric(gw, 504) == before + 1


def test_the_clients_read_timeout_is_not_a_deadline(
    fleet: Fleet, gw: GatewayServer, access_log: AccessLines
) -> None:
    hang(fleet)
    # openai sends x-stainless-read-timeout: 0.7, a per-read timeout the gateway does not read:
    # the client gives up on its own and the request is recorded as gone (499), not a 504.
    with pytest.raises(openai.APITimeoutError):
        client(gw, timeout=0.7).chat.completions.create(
            model="chat",
            messages=MSG,  # type: ignore[arg-type]
            max_tokens=8,
        )
    poll(lambda: any(x["status"] == 499 for x in access_log.lines))
    assert [x["status"] for x in access_log.lines] == [499], access_log.lines


def test_the_gateway_header_shortens_the_deadline(fleet: Fleet, gw: GatewayServer) -> None:
    hang(fleet)
    r, took = post(gw, {"x-gateway-timeout": "0.15"})
    assert 0.15 <= took < 0.15 + SLACK_S, took
    assert_deadline_504(r, "x-gateway-timeout")
    ctx = gw.seen[-1]
    # Cut before its own first-byte limit (0.35 s): settled as outrun, not as the member's failure.
    assert (ctx.attempts, ctx.failures) == (1, [])


def test_a_models_own_deadline_is_shorter_than_the_policys(fleet: Fleet, gw: GatewayServer) -> None:
    hang(fleet)
    r, took = post(gw, model="quick")
    assert MODEL_DEADLINE_S <= took < MODEL_DEADLINE_S + SLACK_S, took
    assert_deadline_504(r, "models.quick.deadline_s")
    assert "0.5 s" in r.json()["error"]["message"]
    # The client's header still shortens it; another model keeps the policy's deadline.
    r, took = post(gw, {"x-gateway-timeout": "0.15"}, model="quick")
    assert_deadline_504(r, "x-gateway-timeout")
    r, took = post(gw, model="chat")
    assert took >= DEADLINE_S, took
    assert_deadline_504(r, "retry.deadline_s")


@pytest.mark.parametrize(
    "value",
    ["abc", "nan", "inf", "-1", "1e3", "0", "0.000", "1_0", "None", "9" * 40, "0x10", "1,2"],
)
def test_nonsense_header_values_are_ignored(gw: GatewayServer, value: str) -> None:
    # Ignored, not refused: the policy's deadline applies and healthy members answer.
    r, _ = post(gw, {"x-gateway-timeout": value, "x-stainless-read-timeout": value})
    assert r.status_code == 200, r.text


def test_header_values_are_parsed_bounded() -> None:
    assert header_seconds("2") == 2.0
    assert header_seconds("0.25") == 0.25
    assert header_seconds("600.0") == 600.0
    for bad in (
        None,
        "",
        "0",
        "-0.5",
        "+1",
        "1e2",
        "nan",
        "inf",
        "Infinity",
        "1.",
        ".5",
        "1 ",
        " 1",
        "\u00b2",
        "\uff11",
    ):
        assert header_seconds(bad) is None, bad
    assert header_seconds("1" * 32) is None  # beyond 12 digits: not a timeout anyone means
    assert header_seconds("1" * 5000) is None


def test_a_backoff_that_would_overshoot_is_not_started(
    fleet: Fleet, gw: GatewayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        fleet.set_faults(name, error_rate=1.0, error_status=[503])
    sent = sum(requests_at(fleet, n) for n in ("a", "b", "c"))
    monkeypatch.setattr(retry, "backoff_s", lambda *a: 5.0)  # the jitter's worst case
    r, took = post(gw)
    # The request ends at once with the member's failure, as when its retries are used up.
    assert took < 0.5, took
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_error"
    assert gw.seen[-1].attempts == 1
    assert sum(requests_at(fleet, n) for n in ("a", "b", "c")) == sent + 1
    # A wait that fits is waited: 2 x 0.25 s, then the third member's failure.
    monkeypatch.setattr(retry, "backoff_s", lambda *a: 0.25)
    r, took = post(gw)
    assert 0.5 <= took < DEADLINE_S, took
    assert (r.status_code, gw.seen[-1].attempts) == (502, 3)


def test_retry_after_and_backoff_waits_must_fit_what_is_left() -> None:
    r = Retrier(RetrySettings(base_backoff_ms=0, max_backoff_ms=0, max_retry_after_ms=5000))
    assert r.delay_s(1, retry_after_s=0.2) == 0.2
    assert r.delay_s(1, retry_after_s=0.2, left_s=0.5) == 0.2
    assert r.delay_s(1, retry_after_s=0.5, left_s=0.5) is None  # nothing left to try after it
    assert r.delay_s(1, left_s=0.001) is None
    assert r.delay_s(1, left_s=0.5) == 0.0
    jittered = Retrier(RetrySettings(base_backoff_ms=400, max_backoff_ms=400))
    for _ in range(50):
        wait = jittered.delay_s(1, left_s=0.2)
        assert wait is None or wait + retry.MIN_ATTEMPT_S <= 0.2


def test_a_stream_is_cut_before_it_commits_with_a_json_504(fleet: Fleet, gw: GatewayServer) -> None:
    hang(fleet)
    r, took = post(gw, {"x-gateway-timeout": "0.15"}, stream=True)
    assert took < 0.15 + SLACK_S, took
    assert r.headers["content-type"].startswith("application/json")
    assert_deadline_504(r, "x-gateway-timeout")


def test_a_committed_stream_is_not_cut(gw: GatewayServer) -> None:
    # 16 tokens at 20 tokens/s: the stream runs about 0.8 s, far past its 0.25 s deadline.
    n = len(gw.seen)
    start = time.monotonic()
    chunks: list[Any] = list(
        client(gw).chat.completions.create(
            model="slowchat",
            messages=MSG,  # type: ignore[arg-type]
            max_tokens=16,
            stream=True,
            extra_headers={"x-gateway-timeout": "0.25"},
        )
    )
    took = time.monotonic() - start
    assert took > 0.5, took
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) >= 8, text
    poll(lambda: len(gw.seen) > n)
    assert gw.seen[-1].status == 200 and gw.seen[-1].failures == []


def test_degradation_answers_when_the_deadline_runs_out(
    fleet: Fleet, gateway: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    # Rules answer every request nothing could serve: a gateway of its own.
    (tmp_path / "10-rules.yaml").write_text(RULES)
    gw = gateway(policy(fleet, tmp_path))
    hang(fleet)
    messages = [{"role": "user", "content": "please degrademe"}]
    r, took = post(gw, {"x-gateway-timeout": "0.15"}, messages=messages)
    assert took < 0.15 + SLACK_S, took
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-degraded"] == "true"
    assert r.json()["choices"][0]["message"]["content"] == "Degraded: try again later."


def test_a_hedged_request_stops_at_the_deadline(fleet: Fleet, gw: GatewayServer) -> None:
    hang(fleet, "a", "b")
    r, took = post(gw, {"x-gateway-timeout": "0.15"}, model="hedged")
    assert 0.15 <= took < 0.15 + SLACK_S, took
    assert_deadline_504(r, "x-gateway-timeout")
    ctx = gw.seen[-1]
    assert ctx.hedged and ctx.attempts == 2 and ctx.failures == []


def test_a_queue_wait_stops_at_the_deadline(fleet: Fleet, gw: GatewayServer) -> None:
    hang(fleet, "a")
    sent = requests_at(fleet, "a")
    # The only member's one slot is taken by a request that waits out the policy's deadline.
    holder = threading.Thread(target=post, args=(gw,), kwargs={"model": "queued"})
    holder.start()
    try:
        poll(lambda: requests_at(fleet, "a") > sent)
        r, took = post(gw, {"x-gateway-timeout": "0.15"}, model="queued")
        assert 0.15 <= took < 0.15 + SLACK_S, took
        assert_deadline_504(r, "x-gateway-timeout")
        assert gw.seen[-1].attempts == 0
        assert "before any provider answered." in r.json()["error"]["message"]
    finally:
        holder.join(5)


def test_the_messages_api_answers_in_anthropics_shape(fleet: Fleet, gw: GatewayServer) -> None:
    hang(fleet)
    c = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0, timeout=5.0)
    with pytest.raises(anthropic.APIStatusError) as caught:
        c.messages.create(
            model="chat",
            max_tokens=8,
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"x-gateway-timeout": "0.15"},
        )
    body = caught.value.response.json()
    assert body["type"] == "error", body
    assert "deadline" in body["error"]["message"], body
    # Anthropic's own error types have no 504: the gateway's 504 or 500, as an api_error.
    assert caught.value.status_code in (500, 504), caught.value.status_code
    assert body["error"]["type"] in ("api_error", "timeout_error"), body
