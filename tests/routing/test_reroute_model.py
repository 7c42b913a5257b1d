"""A prompt too long for the alias asked for is routed as its longer-context alias, and each
member is sent THAT alias's model id (a provider serving both aliases maps them to different
models): unary, streamed, through the Messages and Responses APIs, and when a broken stream is
resumed on another member. The answer still names the alias the client asked for."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer, poll


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {
        "id": "chatcmpl-rec",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "whatever",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class Recorder(ThreadedRawServer):
    """An OpenAI-compatible upstream on loopback that records the `model` of every request.

    Base URL `.../<mode>/v1`: `ok` answers; `cut` streams two events, then closes the connection
    without its end (a stream broken mid-way).
    """

    def __init__(self) -> None:
        super().__init__()
        self.models: list[tuple[str, str]] = []  # (mode, model)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            mode = head[0].split(" ")[1].strip("/").split("/")[0]
            length = 0
            for line in head[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            req = json.loads(await reader.readexactly(length))
            self.models.append((mode, req.get("model")))
            if req.get("stream"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"connection: close\r\n\r\n"
                )
                writer.write(_chunk({"role": "assistant", "content": ""}))
                writer.write(_chunk({"content": "part one"}))
                if mode == "cut":
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    writer.transport.abort()
                    return
                writer.write(_chunk({"content": " and two"}) + _chunk({}, "stop"))
                writer.write(b"data: [DONE]\n\n")
                await writer.drain()
                return
            body = json.dumps(
                {
                    "id": "chatcmpl-rec",
                    "object": "chat.completion",
                    "created": 1,
                    "model": req.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "answered"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


MODELS = "{chat: small-8k, chat-long: big-128k}"


def policy(recorder: Recorder, long_members: str = "first") -> str:
    return f"""
providers:
  first: {{base_url: '{recorder.url("ok")}', models: {MODELS}}}
  cutter: {{base_url: '{recorder.url("cut")}', models: {MODELS}}}
  second: {{base_url: '{recorder.url("ok")}', models: {MODELS}}}
pools:
  short: {{members: [first]}}
  long: {{members: [{long_members}], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: short, context_window: 200, fallback_alias: chat-long, resume: true}}
  chat-long: {{pool: long, context_window: 100000, resume: true}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
"""


LONG = "many words " * 200  # about 400 tokens: over the 200 of `chat`
SHORT = "a short question"


@pytest.fixture
def clients(
    recorder: Recorder, gateway: Callable[..., GatewayServer]
) -> tuple[GatewayServer, openai.OpenAI, anthropic.Anthropic]:
    gw = gateway(policy(recorder))
    oa = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    an = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    return gw, oa, an


@pytest.mark.parametrize("api", ["chat", "chat-stream", "messages", "messages-stream", "responses"])
def test_a_rerouted_prompt_is_sent_the_longer_alias_model(
    recorder: Recorder,
    clients: tuple[GatewayServer, openai.OpenAI, anthropic.Anthropic],
    api: str,
) -> None:
    gw, oa, an = clients
    for text, pool, model in ((SHORT, "short", "small-8k"), (LONG, "long", "big-128k")):
        recorder.models.clear()
        if api == "chat":
            r = oa.chat.completions.with_raw_response.create(
                model="chat", messages=[{"role": "user", "content": text}], max_tokens=5
            )
            assert r.parse().model == "chat"  # the alias the client asked for
        elif api == "chat-stream":
            r = oa.chat.completions.with_raw_response.create(
                model="chat", messages=[{"role": "user", "content": text}], stream=True
            )
            chunks = list(r.parse())
            assert chunks and all(c.model == "chat" for c in chunks)
        elif api == "messages":
            r = an.messages.with_raw_response.create(
                model="chat", max_tokens=5, messages=[{"role": "user", "content": text}]
            )
            assert r.parse().model == "chat"
        elif api == "messages-stream":
            r = an.messages.with_raw_response.create(
                model="chat",
                max_tokens=5,
                stream=True,
                messages=[{"role": "user", "content": text}],
            )
            assert [e.type for e in r.parse()][-1] == "message_stop"
        else:
            r = oa.responses.with_raw_response.create(
                model="chat", input=text, max_output_tokens=16
            )
            assert r.parse().model == "chat"
        assert r.headers["x-gateway-pool"] == pool
        assert recorder.models == [("ok", model)]


def test_a_resumed_rerouted_stream_continues_on_the_longer_alias_model(
    recorder: Recorder, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(policy(recorder, long_members="cutter, second"))
    oa = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    stream = oa.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": LONG}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "part onepart one and two"  # the continuation spliced in
    poll(lambda: gw.seen)  # recorded just after the stream's last byte
    assert gw.seen[-1].resumed
    assert recorder.models == [("cut", "big-128k"), ("ok", "big-128k")]
