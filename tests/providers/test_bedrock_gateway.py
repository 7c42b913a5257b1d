"""`type: bedrock` providers through the gateway, with the official `openai` client unchanged.

The upstream is the Bedrock-shaped simulator: it verifies each request's SigV4 signature with
botocore and validates its body against botocore's service model of bedrock-runtime, so a
mapping or signing slip fails these tests. A mixed pool (openai + bedrock members) keeps
answering while either member is down.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import orjson
import pytest

from loadtests.simulator.bedrock import BedrockCredentials, run_bedrock
from tests.support import GatewayServer, validate, validate_sse

CREDS = BedrockCredentials(
    "AKIDGATEWAYTEST", "gw-test-secret-access-key", "gw-session-tok", "eu-west-1"
)
ENV = {
    "BR_TEST_KEY_ID": CREDS.access_key_id,
    "BR_TEST_SECRET": CREDS.secret_access_key,
    "BR_TEST_TOKEN": CREDS.session_token or "",
}
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


def bedrock_provider(
    url: str, secret_env: str = "BR_TEST_SECRET", extra: str = "", settings: str = ""
) -> str:
    return (
        f"{{type: bedrock, base_url: '{url}', models: {{'*': '{MODEL}'}}, {extra}"
        "bedrock: {region: eu-west-1, access_key_id_env: BR_TEST_KEY_ID, "
        f"secret_access_key_env: {secret_env}, session_token_env: BR_TEST_TOKEN{settings}}}}}"
    )


def policy(
    sim_url: str, fleet_url: str | None = None, secret_env: str = "BR_TEST_SECRET", extra: str = ""
) -> str:
    members = ["br"] + (["oa"] if fleet_url else [])
    oa = (
        f"\n  oa: {{base_url: '{fleet_url}', models: {{'*': sim-a}}, {extra}}}" if fleet_url else ""
    )
    return f"""
providers:
  br: {bedrock_provider(sim_url, secret_env, extra)}{oa}
pools:
  main: {{members: [{", ".join(members)}], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture(scope="module")
def sim() -> Iterator:
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        with run_bedrock(CREDS, models=(MODEL,), context_window=2000) as s:
            yield s
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def gw(sim) -> Iterator[GatewayServer]:
    with GatewayServer(policy(sim.url)) as g:
        yield g


@pytest.fixture
def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def test_plain_chat(client, sim) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="chat",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"},
        ],
        max_tokens=8,
        temperature=0.2,
    )
    validate("CreateChatCompletionResponse", raw.http_response.json())
    resp = raw.parse()
    assert raw.headers["x-gateway-provider"] == "br"
    assert resp.choices[0].message.content and resp.choices[0].finish_reason == "length"
    assert resp.model == "chat"
    assert resp.usage.completion_tokens == 8
    sent = sim.stats.last_body
    assert sent["system"] == [{"text": "You are terse."}]
    assert sent["inferenceConfig"] == {"maxTokens": 8, "temperature": 0.2}


def test_streaming_matches_unary(client, gw) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "Count"}], "max_tokens": 6}
    unary = client.chat.completions.create(**body).choices[0].message.content
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=10,
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = validate_sse(r.content)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert {c["model"] for c in chunks} == {"chat"}  # the alias, as for any provider type
    streamed = client.chat.completions.create(**body, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == unary


def test_tools_round_trip(client, sim) -> None:
    messages = [{"role": "user", "content": "Weather in Lisbon?"}]
    resp = client.chat.completions.create(
        model="chat", messages=messages, tools=[WEATHER], tool_choice="required"
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    jsonschema.validate(orjson.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, clear"},
    ]
    follow = client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER])
    assert follow.choices[0].finish_reason == "stop" and follow.choices[0].message.content
    sent = sim.stats.last_body["messages"]
    assert sent[1]["content"][0]["toolUse"]["toolUseId"] == call.id
    assert sent[2]["content"][0]["toolResult"]["toolUseId"] == call.id
    # Streamed tool calls arrive as OpenAI deltas the SDK reassembles.
    stream = client.chat.completions.create(
        model="chat",
        messages=messages[:1],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    args, finish = "", None
    for c in stream:
        if c.choices:
            for tc in c.choices[0].delta.tool_calls or []:
                args += tc.function.arguments or ""
            finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls" and orjson.loads(args) == orjson.loads(call.function.arguments)


def test_json_schema_output(client) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    resp = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "A person"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(orjson.loads(resp.choices[0].message.content), schema)


def test_errors_map_to_the_gateway_kinds(client, sim, gw) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "word " * 3000}]
        )
    assert e.value.code == "context_length_exceeded"
    # A request Converse cannot express is refused before any upstream call.
    before = sim.stats.requests
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x"}], n=2
        )
    assert sim.stats.requests == before
    sim.set_fault(429, "ThrottlingException", "Too many requests")
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "x"}]
            )
        assert e.value.status_code in (429, 503)
    finally:
        sim.clear_faults()


def test_wrong_secret_is_upstream_auth_and_never_leaks(sim) -> None:
    os.environ["BR_TEST_WRONG"] = "not-the-secret-value-1234"
    try:
        with GatewayServer(policy(sim.url, secret_env="BR_TEST_WRONG")) as g:
            r = httpx.post(
                g.base_url + "/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "x"}]},
                timeout=10,
            )
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_auth_failed"
            assert "not-the-secret-value-1234" not in r.text
            assert httpx.get(g.url + "/admin/breakers").json()["br"]["state"] == "open"
    finally:
        os.environ.pop("BR_TEST_WRONG", None)


def _ask(gw: GatewayServer, stream: bool) -> httpx.Response:
    return httpx.post(
        gw.base_url + "/chat/completions",
        json={
            "model": "chat",
            "messages": [{"role": "user", "content": "Are you there?"}],
            "max_tokens": 5,
            "stream": stream,
        },
        timeout=10,
    )


def metric(gw: GatewayServer, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    want = set(labels.items())
    return sum(
        s.value
        for fam in text_string_to_metric_families(httpx.get(gw.url + "/metrics").text)
        for s in fam.samples
        if s.name == name and want <= set(s.labels.items())
    )


# Trip after two failures in a row, so that a short test sees the breaker open.
QUICK_BREAKER = "breaker: {consecutive_failures: 2}, "


def test_mixed_pool_keeps_answering_while_one_member_is_down(sim, fleet) -> None:
    with GatewayServer(policy(sim.url, fleet.url("a"), extra=QUICK_BREAKER)) as g:
        served = set()
        for i in range(6):
            r = _ask(g, stream=bool(i % 2))
            assert r.status_code == 200
            served.add(r.headers["x-gateway-provider"])
        assert served == {"br", "oa"}
        # Bedrock down (503 on every call, and a stream that fails with an exception event).
        sim.set_fault(503, "ServiceUnavailableException", "down")
        try:
            for i in range(8):
                r = _ask(g, stream=bool(i % 2))
                assert r.status_code == 200, r.text
                if i % 2:
                    validate_sse(r.content)
        finally:
            sim.clear_faults()
        assert httpx.get(g.url + "/admin/breakers").json()["br"]["state"] != "closed"
        assert metric(g, "gateway_upstream_failures_total", provider="br", kind="upstream_5xx") >= 2
    with GatewayServer(policy(sim.url, fleet.url("a"), extra=QUICK_BREAKER)) as g:
        # The openai member down: every answer comes from bedrock, streams included.
        fleet.set_faults("a", error_rate=1.0, error_status=[503])
        try:
            for i in range(8):
                r = _ask(g, stream=bool(i % 2))
                assert r.status_code == 200, r.text
                if i % 2:
                    chunks = validate_sse(r.content)
                    assert "".join(
                        c["choices"][0]["delta"].get("content") or ""
                        for c in chunks
                        if c["choices"]
                    )
        finally:
            fleet.clear_faults("a")
        assert httpx.get(g.url + "/admin/breakers").json()["oa"]["state"] != "closed"
        assert metric(g, "gateway_upstream_failures_total", provider="oa", kind="upstream_5xx") >= 2


def test_stream_exception_before_any_byte_is_retried(sim, fleet) -> None:
    sim.sim.stream_exception = (0, "throttlingException")
    try:
        with GatewayServer(policy(sim.url, fleet.url("a"))) as g:
            for _ in range(4):
                r = _ask(g, stream=True)
                assert r.status_code == 200
                validate_sse(r.content)
                assert r.headers["x-gateway-provider"] == "oa"
    finally:
        sim.clear_faults()


@pytest.mark.parametrize(
    ("provider", "says"),
    [
        (
            "{type: bedrock, base_url: 'https://bedrock-runtime.us-east-1.amazonaws.com/v1'}",
            "without a path",
        ),
        (
            "{type: bedrock, base_url: 'https://bedrock-runtime.us-east-1.amazonaws.com', "
            "api_key_env: AWS_KEY}",
            "signs with AWS credentials",
        ),
        (
            "{type: bedrock, base_url: 'https://bedrock-runtime.us-east-1.amazonaws.com', "
            "bedrock: {region: eu-west-1}}",
            "differs from the region of base_url",
        ),
        (
            "{type: bedrock, base_url: 'https://x.test', bedrock: {secret_access_key_env: 'A-B'}}",
            "not an environment variable name",
        ),
        (
            "{type: bedrock, base_url: 'https://x.test', bedrock: {access_key_id_env: GATEWAY_X}}",
            "GATEWAY_",
        ),
        ("{type: bedrock, base_url: 'https://x.test', bedrock: {regoin: us-east-1}}", "regoin"),
        ("{base_url: 'https://x.test', bedrock: {region: us-east-1}}", "type openai"),
    ],
)
def test_bad_bedrock_settings_are_refused_with_their_path(provider: str, says: str) -> None:
    from gateway.policy.loader import PolicyError, parse_policy

    text = (
        f"providers:\n  br: {provider}\npools:\n  p: {{members: [br]}}\nmodels:\n  m: {{pool: p}}\n"
    )
    with pytest.raises(PolicyError) as e:
        parse_policy(text, env={})
    assert "providers.br" in str(e.value) and says in str(e.value)


def test_unset_credentials_warn_and_region_comes_from_the_host() -> None:
    from gateway.policy.loader import check_policy
    from gateway.providers.settings import bedrock_region

    text = (
        "providers:\n  br: {type: bedrock, base_url: 'https://bedrock-runtime.ap-south-1."
        "amazonaws.com'}\npools:\n  p: {members: [br]}\nmodels:\n  m: {pool: p}\n"
    )
    report = check_policy(text, env={})
    said = str(report)
    assert "AWS_ACCESS_KEY_ID" in said and "AWS_SECRET_ACCESS_KEY" in said
    assert (
        bedrock_region("https://bedrock-runtime.ap-south-1.amazonaws.com", None, {}) == "ap-south-1"
    )
    assert bedrock_region("http://127.0.0.1:1", None, {"AWS_REGION": "eu-north-1"}) == "eu-north-1"


def test_missing_botocore_is_a_clear_error(monkeypatch) -> None:
    import importlib.util
    import sys

    from gateway.policy.loader import PolicyError, parse_policy
    from gateway.providers import bedrock_wire

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "botocore" else real(name, *a)
    )
    text = (
        "providers:\n  br: {type: bedrock, base_url: 'http://127.0.0.1:1'}\n"
        "pools:\n  p: {members: [br]}\nmodels:\n  m: {pool: p}\n"
    )
    with pytest.raises(PolicyError, match=r"llm-gateway\[aws\]"):
        parse_policy(text, env={})
    monkeypatch.setitem(sys.modules, "botocore", None)
    with pytest.raises(RuntimeError, match=r"llm-gateway\[aws\]"):
        bedrock_wire.botocore_modules()


def test_messages_and_responses_apis_answered_by_bedrock(gw) -> None:
    """The inbound Anthropic Messages and OpenAI Responses APIs, translated onto chat, are
    answered by a bedrock member like any other."""
    import anthropic

    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    msg = claude.messages.create(
        model="chat",
        max_tokens=6,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 6
    with claude.messages.stream(
        model="chat", max_tokens=6, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed
    forced = claude.messages.create(
        model="chat",
        max_tokens=50,
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[
            {
                "name": "get_weather",
                "description": "Weather of a city",
                "input_schema": WEATHER["function"]["parameters"],
            }
        ],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    use = next(b for b in forced.content if b.type == "tool_use")
    jsonschema.validate(use.input, WEATHER["function"]["parameters"])
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    resp = client.responses.create(model="chat", input="Hello", max_output_tokens=16)
    assert resp.output_text
    events = [e.type for e in client.responses.create(model="chat", input="Hi", stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"


def test_prompt_cache_point_reports_cached_tokens(sim) -> None:
    provider = bedrock_provider(sim.url, settings=", cache_system_prompt: true")
    text = f"providers:\n  br: {provider}\npools:\n  p: {{members: [br]}}\nmodels:\n  chat: {{pool: p}}\n"
    with GatewayServer(text) as g:
        client = openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0)
        system = "You answer questions about the harbor timetable. " * 8
        asks = [
            client.chat.completions.create(
                model="chat",
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ],
                max_tokens=4,
            )
            for i in range(2)
        ]
    assert sim.stats.last_body["system"][-1] == {"cachePoint": {"type": "default"}}
    assert asks[0].usage.prompt_tokens_details.cached_tokens == 0
    cached = asks[1].usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and asks[1].usage.prompt_tokens == asks[0].usage.prompt_tokens


def test_a_broken_bedrock_stream_is_resumed_on_another_member(sim) -> None:
    """Stream resume works for bedrock members too: the partial answer goes to the next member
    as a trailing assistant turn (Converse continues it) and the client sees one stream."""
    with run_bedrock(CREDS, models=(MODEL,)) as other:
        text = f"""
providers:
  br1: {bedrock_provider(sim.url)}
  br2: {bedrock_provider(other.url)}
pools:
  main: {{members: [br1, br2], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main, resume: true}}
"""
        body = {"model": "chat", "messages": [{"role": "user", "content": "Tell a story"}]}
        with GatewayServer(text) as g:
            client = openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0)
            whole = client.chat.completions.create(**body, max_tokens=12).choices[0].message.content
            sim.sim.stream_cut_after = 6  # br1: messageStart + 5 words, then the connection drops
            try:
                resumed = []
                for _ in range(2):  # round robin: one of the two starts on br1
                    r = httpx.post(
                        g.base_url + "/chat/completions",
                        json={**body, "max_tokens": 12, "stream": True},
                        timeout=10,
                    )
                    chunks = validate_sse(r.content)
                    got = "".join(
                        c["choices"][0]["delta"].get("content") or ""
                        for c in chunks
                        if c["choices"]
                    )
                    assert got == whole
                    resumed.append(chunks[-1].get("gateway_resumed"))
            finally:
                sim.clear_faults()
            assert {"from": "br1", "on": "br2"} in resumed, resumed


def test_an_exception_event_mid_stream_ends_with_an_error_event(gw, sim) -> None:
    """Once chunks reached the client, a throttlingException event cannot be retried: the client
    stream ends with an OpenAI-shaped error event, never a silent truncated 200."""
    sim.sim.stream_exception = (4, "throttlingException")
    sim.sim.event_delay_s = 0.02  # the first words reach the client before the exception
    try:
        r = httpx.post(
            gw.base_url + "/chat/completions",
            json={
                "model": "chat",
                "messages": [{"role": "user", "content": "Go on"}],
                "max_tokens": 10,
                "stream": True,
            },
            timeout=10,
        )
    finally:
        sim.clear_faults()
    assert r.status_code == 200, r.text
    events = [e[6:] for e in r.text.strip().split("\n\n") if e.startswith("data: ")]
    assert "[DONE]" not in events
    last = orjson.loads(events[-1])
    assert "error" in last and last["error"]["message"]
    assert any(orjson.loads(e).get("choices") for e in events[:-1])  # words came before it
