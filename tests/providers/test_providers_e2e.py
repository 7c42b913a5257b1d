"""Each provider adapter end to end: the official `openai` SDK -> gateway -> a provider-shaped
simulator that checks every request against the provider's published shape (a wrong field is a
400 there, which fails these tests). Also a pool mixing `openai` and `anthropic` members."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from pydantic import BaseModel

from gateway.resilience.breaker import BreakerState
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, validate

AN_KEY, AZ_KEY = "ak-sim-7c1d", "az-sim-93e2"
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Name three rivers."}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


FLEET: list[Any] = [
    {"name": "oa", "profile": "fast"},
    {"name": "oa2", "profile": "fast"},
    {"name": "an", "profile": "fast", "wire": "anthropic", "api_key": AN_KEY},
    {
        "name": "az",
        "profile": "fast",
        "wire": "azure",
        "api_key": AZ_KEY,
        "overrides": {"models": ["gpt4o-dep", "embed-dep"]},
    },
]


def root(fleet: Fleet, name: str) -> str:
    return fleet.root_url(name)


def policy(fleet: Fleet) -> str:
    return f"""
providers:
  oa: {{base_url: '{fleet.url("oa")}', breaker: {{consecutive_failures: 3, cooldown_s: 30}}}}
  oa2: {{base_url: '{fleet.url("oa2")}'}}
  an:
    type: anthropic
    base_url: '{root(fleet, "an")}'
    api_key_env: SIM_ANTHROPIC_KEY
    models: {{'*': claude-sim-1}}
    breaker: {{consecutive_failures: 3, cooldown_s: 30}}
    anthropic: {{max_tokens: 40, cache_prefix: true}}
  an_rl:
    type: anthropic
    base_url: '{root(fleet, "an")}'
    api_key_env: SIM_ANTHROPIC_KEY
  an_badkey:
    type: anthropic
    base_url: '{root(fleet, "an")}'
    api_key_env: SIM_WRONG_KEY
  az:
    type: azure
    base_url: '{root(fleet, "az")}'
    api_key_env: SIM_AZURE_KEY
    models: {{azure: gpt4o-dep, azure-embed: embed-dep}}
  az1:
    type: azure
    base_url: '{root(fleet, "az")}'
    api_key_env: SIM_AZURE_KEY
    models: {{'*': gpt4o-dep}}
    azure: {{surface: v1, auth: bearer}}
pools:
  anthropic: {{members: [an]}}
  anthropic_badkey: {{members: [an_badkey]}}
  anthropic_rl: {{members: [an_rl]}}
  azure: {{members: [az]}}
  azure_v1: {{members: [az1]}}
  mixed: {{members: [oa, an], balancer: {{strategy: round_robin}}, max_attempts: 2}}
  first: {{members: [oa2], fallback: [second]}}
  second: {{members: [an]}}
models:
  claude: {{pool: anthropic}}
  claude-badkey: {{pool: anthropic_badkey}}
  claude-rl: {{pool: anthropic_rl}}
  azure: {{pool: azure}}
  azure-embed: {{pool: azure}}
  azure-v1: {{pool: azure_v1}}
  mixed: {{pool: mixed}}
  resumable: {{pool: first, resume: true}}
"""


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    env = {"SIM_ANTHROPIC_KEY": AN_KEY, "SIM_AZURE_KEY": AZ_KEY, "SIM_WRONG_KEY": "nope"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with GatewayServer(policy(fleet)) as server:
            yield server
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)


def wire(fleet: Fleet, name: str) -> Any:
    return fleet._control.server.instances[name].wire  # type: ignore[attr-defined]


def requests_at(fleet: Fleet, name: str, endpoint: str = "chat") -> int:
    return int(fleet.stats(name)["by_endpoint"].get(endpoint, 0))


# -- anthropic ----------------------------------------------------------------------------------


def test_anthropic_plain(fleet: Fleet, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="claude",
        messages=[SYSTEM, USER],
        max_tokens=12,
        stop=["END"],
        user="u-1",
        temperature=0.2,  # no counterpart in the Messages API: not sent (the simulator refuses it)
        seed=3,
    )
    validate("CreateChatCompletionResponse", r.model_dump(exclude_unset=True))
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    assert r.model == "claude"  # the alias (response_model's default), not the provider's id
    sent = wire(fleet, "an").last_request
    assert sent["model"] == "claude-sim-1" and sent["max_tokens"] == 12
    assert sent["system"][0]["text"] == "You are terse."
    assert [m["role"] for m in sent["messages"]] == ["user"]
    assert sent["stop_sequences"] == ["END"] and sent["metadata"] == {"user_id": "u-1"}


def test_anthropic_default_max_tokens_and_cache_prefix(fleet: Fleet, client: openai.OpenAI) -> None:
    system = {"role": "system", "content": "Shared instructions " * 40}
    first = client.chat.completions.create(model="claude", messages=[system, USER])
    sent = wire(fleet, "an").last_request
    assert sent["max_tokens"] == 40  # the provider's anthropic.max_tokens
    assert sent["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    second = client.chat.completions.create(
        model="claude",
        messages=[
            system,
            USER,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        ],
    )
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached and cached > 100 and second.usage.prompt_tokens > cached  # type: ignore[union-attr]
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]


def test_anthropic_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="claude",
            messages=[SYSTEM, USER],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for c in chunks:
        validate("CreateChatCompletionStreamResponse", c.model_dump(exclude_unset=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.model for c in chunks} == {"claude"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 10
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10  # type: ignore[union-attr]
    assert len({c.id for c in chunks}) == 1


def test_anthropic_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(model="claude", messages=[USER], max_tokens=5, stream=True)
    )
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_anthropic_tools_round_trip(fleet: Fleet, client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    r = client.chat.completions.create(
        model="claude",
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments)["city"] == "sim"
    sent = wire(fleet, "an").last_request
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert sent["tools"][0]["input_schema"]["required"] == ["city"]
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    r2 = client.chat.completions.create(model="claude", messages=messages, tools=[WEATHER])
    assert r2.choices[0].finish_reason in ("stop", "length") and r2.choices[0].message.content
    sent = wire(fleet, "an").last_request
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1]["content"][-1]["type"] == "tool_use"
    assert sent["messages"][2]["content"][0]["tool_use_id"] == call.id


def test_anthropic_streamed_tool_call(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="claude",
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            stream=True,
        )
    )
    for c in chunks:
        validate("CreateChatCompletionStreamResponse", c.model_dump(exclude_unset=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert orjson.loads(args) == {"city": "sim", "days": 1}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


class Rivers(BaseModel):
    names: list[str]
    count: int


def test_anthropic_json_schema_output(fleet: Fleet, client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model="claude", messages=[USER], response_format=Rivers)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Rivers)
    assert wire(fleet, "an").last_request["output_config"]["format"]["type"] == "json_schema"
    j = client.chat.completions.create(
        model="claude", messages=[USER], response_format={"type": "json_object"}
    )
    assert isinstance(orjson.loads(j.choices[0].message.content or ""), dict)


def test_anthropic_image_parts(fleet: Fleet, client: openai.OpenAI) -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]
    r = client.chat.completions.create(
        model="claude", messages=[{"role": "user", "content": content}]
    )
    assert r.choices[0].message.content
    blocks = wire(fleet, "an").last_request["messages"][0]["content"]
    assert blocks[1]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": PNG.split(",", 1)[1],
    }
    assert blocks[2]["source"] == {"type": "url", "url": "https://example.com/cat.jpg"}


def test_anthropic_errors_map_to_failure_kinds(
    fleet: Fleet, gw: GatewayServer, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="claude", messages=[{"role": "user", "content": "word " * 40000}]
        )
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    with pytest.raises(openai.APIStatusError) as e2:
        client.chat.completions.create(model="claude-badkey", messages=[USER])
    assert e2.value.status_code == 502 and e2.value.code == "upstream_auth_failed"
    with pytest.raises(openai.BadRequestError) as e3:  # not expressible: no upstream call
        client.chat.completions.create(
            model="claude",
            messages=[
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "[1]"},
                        }
                    ],
                },
                {"role": "user", "content": "x"},
            ],
        )
    assert e3.value.param == "messages[0].tool_calls[0].function.arguments"
    with pytest.raises(openai.BadRequestError) as e4:
        client.embeddings.create(model="claude", input="x")
    assert e4.value.code == "unsupported_endpoint"
    assert e4.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e6:
        client.chat.completions.create(model="claude", messages=[USER], n=2)
    assert e6.value.code == "unsupported_endpoint" and "n > 1" in e6.value.message
    try:
        fleet.set_faults("an", rate_limit=1.0, retry_after_s=7)
        with pytest.raises(openai.APIStatusError) as e5:
            client.chat.completions.create(model="claude-rl", messages=[USER])
        assert e5.value.status_code in (429, 503) and e5.value.response.headers["retry-after"]
    finally:
        fleet.clear_faults("an")


def test_anthropic_simulator_refuses_what_the_api_refuses(fleet: Fleet) -> None:
    url = root(fleet, "an") + "/v1/messages"
    headers = {"x-api-key": AN_KEY, "anthropic-version": "2023-06-01"}
    good = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url, json=good, headers=headers).status_code == 200
    bad = [
        {**good, "temperature": 0.5},  # not in the published MessageCreateParams
        {**good, "messages": [{"role": "developer", "content": "x"}, *good["messages"]]},
        {
            **good,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}
            ],
        },
        {
            **good,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}],
        },
        {**good, "messages": [{"role": "tool", "content": "x"}]},
        {k: v for k, v in good.items() if k != "max_tokens"},
        {**good, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
    ]
    for body in bad:
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(url, json=good, headers={**headers, "x-api-key": "no"}).status_code == 401
    assert httpx.post(url, json=good, headers={"x-api-key": AN_KEY}).status_code == 400


# -- azure --------------------------------------------------------------------------------------


def test_azure_deployment_chat_stream_and_embeddings(fleet: Fleet, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="azure", messages=[USER], max_tokens=6)
    assert r.choices[0].message.content
    assert wire(fleet, "az").last_path == (
        b"/openai/deployments/gpt4o-dep/chat/completions?api-version=2024-10-21"
    )
    chunks = list(
        client.chat.completions.create(model="azure", messages=[USER], max_tokens=6, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    e = client.embeddings.create(model="azure-embed", input=["a", "b"])
    assert len(e.data) == 2
    assert wire(fleet, "az").last_path.startswith(b"/openai/deployments/embed-dep/embeddings?")


def test_azure_tools_and_json_output_pass_unchanged(fleet: Fleet, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="azure",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and isinstance(
        orjson.loads(call.function.arguments), dict
    )
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    client.chat.completions.create(model="azure", messages=[USER], response_format=fmt)  # type: ignore[arg-type]
    sent = orjson.loads(wire(fleet, "az").last_body)
    assert sent["response_format"] == fmt and sent["model"] == "gpt4o-dep"


def test_azure_v1_surface(fleet: Fleet, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="azure-v1", messages=[USER], max_tokens=4)
    assert r.choices[0].message.content
    assert wire(fleet, "az").last_path == b"/openai/v1/chat/completions"


def test_azure_simulator_checks_path_version_and_key(fleet: Fleet) -> None:
    base = root(fleet, "az")
    body = {"messages": [USER]}
    ok = httpx.post(
        f"{base}/openai/deployments/gpt4o-dep/chat/completions?api-version=2024-10-21",
        json=body,
        headers={"api-key": AZ_KEY},
    )
    assert ok.status_code == 200
    cases = [
        ("/openai/deployments/gpt4o-dep/chat/completions", {"api-key": AZ_KEY}, 400),
        (
            "/openai/deployments/gpt4o-dep/chat/completions?api-version=soon",
            {"api-key": AZ_KEY},
            400,
        ),
        (
            "/openai/deployments/gpt4o-dep/chat/completions?api-version=2024-10-21",
            {"authorization": f"Bearer {AZ_KEY}"},
            401,
        ),
        (
            "/openai/deployments/nope/chat/completions?api-version=2024-10-21",
            {"api-key": AZ_KEY},
            404,
        ),
        ("/v1/chat/completions", {"authorization": f"Bearer {AZ_KEY}"}, 404),
    ]
    for path, headers, status in cases:
        assert httpx.post(base + path, json=body, headers=headers).status_code == status, path


# -- a pool of openai + anthropic members --------------------------------------------------------


def _metric(gw: GatewayServer, name: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + "_total{")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("down", ["oa", "an"])
def test_mixed_pool_keeps_answering_while_one_type_is_down(
    fleet: Fleet, gw: GatewayServer, client: openai.OpenAI, down: str
) -> None:
    up = "an" if down == "oa" else "oa"
    fleet.set_faults(down, error_rate=1.0, error_status=[529 if down == "an" else 500])
    try:
        before_up = requests_at(fleet, up, "messages" if up == "an" else "chat")
        for i in range(8):
            stream = i % 2 == 1
            if stream:
                chunks = list(
                    client.chat.completions.create(
                        model="mixed", messages=[USER], max_tokens=5, stream=True
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] is not None
            else:
                r = client.chat.completions.create(model="mixed", messages=[USER], max_tokens=5)
                text = r.choices[0].message.content or ""
            assert text
        assert requests_at(fleet, up, "messages" if up == "an" else "chat") - before_up == 8
        # The breaker of the member that is down opened after its consecutive failures.
        assert _metric(gw, "gateway_breaker_state", provider=down, state="open") == 1
        kind = "upstream_5xx"
        assert _metric(gw, "gateway_upstream_failures", provider=down, kind=kind) >= 3
    finally:
        fleet.clear_faults(down)
        gw.app.state.runtime.snapshot.providers[down].breaker.force(BreakerState.CLOSED)


def test_stream_resumes_across_types(fleet: Fleet, client: openai.OpenAI) -> None:
    fleet.set_faults("oa2", cut_stream_after_chunks=3)
    try:
        chunks = list(
            client.chat.completions.create(
                model="resumable",
                messages=[USER],
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    finally:
        fleet.clear_faults("oa2")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) >= 4
    final = [c for c in chunks if c.choices][-1]
    assert final.model_extra and final.model_extra["gateway_resumed"] == {"from": "oa2", "on": "an"}
    assert len({c.id for c in chunks}) == 1
    sent = wire(fleet, "an").last_request
    assert sent["messages"][-1]["role"] == "assistant"  # the partial answer, continued (prefill)
    assert chunks[-1].usage is not None


def test_mixed_pool_sends_what_anthropic_cannot_express_to_the_openai_member(
    fleet: Fleet, client: openai.OpenAI
) -> None:
    before = requests_at(fleet, "an", "messages"), requests_at(fleet, "oa")
    for _ in range(4):  # round robin: some of these pick the anthropic member first
        r = client.chat.completions.create(model="mixed", messages=[USER], max_tokens=3, n=2)
        assert r.choices[0].message.content
    assert requests_at(fleet, "an", "messages") == before[0]  # never sent there
    assert requests_at(fleet, "oa") - before[1] == 4


def test_messages_and_responses_apis_answered_by_an_anthropic_member(
    fleet: Fleet, gw: GatewayServer
) -> None:
    """The inbound Anthropic Messages and OpenAI Responses APIs, translated onto chat, reach an
    anthropic member through its adapter (and the simulator's checks) like any other request."""
    import anthropic

    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    msg = claude.messages.create(
        model="claude",
        max_tokens=6,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens > 0
    assert wire(fleet, "an").last_request["system"][0]["text"] == "Be brief."
    with claude.messages.stream(
        model="claude", max_tokens=6, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        assert "".join(stream.text_stream)
    tool = {
        "name": "get_weather",
        "description": "Weather of a city",
        "input_schema": WEATHER["function"]["parameters"],
    }
    forced = claude.messages.create(
        model="claude",
        max_tokens=50,
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    use = next(b for b in forced.content if b.type == "tool_use")
    assert use.input == {"city": "sim", "days": 1}
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    resp = client.responses.create(model="claude", input="Hello", max_output_tokens=16)
    assert resp.output_text
    events = [e.type for e in client.responses.create(model="claude", input="Hi", stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"
