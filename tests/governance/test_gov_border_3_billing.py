"""One rule for what a request is charged (`gateway.observability.metrics.billed`): the spend
counters (governance) and the usage metrics (gateway_*_tokens_total, gateway_cost_usd_total)
agree for every way a request ends: answered (unary, stream with the provider's usage), client
gone before the provider answered, client gone mid-answer (unary and stream), upstream error
(before the answer, or a stream that breaks mid-way).
Real gateway on loopback, a scripted aiohttp upstream, real Redis.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support import GatewayServer, ThreadedUpstream, poll

PROMPT_USAGE, COMPLETION_USAGE = 11, 9  # what the upstream reports (not what it sends)
CONTENT_EVENTS = 4


class Scripted(ThreadedUpstream):
    """Answers by the prompt: ok, slow (answers after 3 s), trickle (headers, then a body that
    never completes in time), err (500); streams: ok, slow (an event every 0.2 s), none (nothing
    for 3 s), break (the connection drops after 3 content events)."""

    def routes(self, app: Any) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            mode = body["messages"][-1]["content"].split()[0]
            usage = {
                "prompt_tokens": PROMPT_USAGE,
                "completion_tokens": COMPLETION_USAGE,
                "total_tokens": PROMPT_USAGE + COMPLETION_USAGE,
            }
            if mode == "err":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            if not body.get("stream"):
                doc = {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "one two three four"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
                raw = json.dumps(doc).encode()
                if mode == "slow":
                    await asyncio.sleep(3)
                if mode == "trickle":
                    resp = web.StreamResponse(headers={"content-type": "application/json"})
                    resp.content_length = len(raw)
                    await resp.prepare(request)
                    for i in range(len(raw)):
                        await resp.write(raw[i : i + 1])
                        await asyncio.sleep(0.1)
                    return resp
                return web.Response(body=raw, content_type="application/json")
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            if mode == "none":
                await asyncio.sleep(3)

            def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
                c = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    **extra,
                }
                return b"data: " + json.dumps(c).encode() + b"\n\n"

            await resp.write(chunk({"role": "assistant", "content": ""}))
            n = CONTENT_EVENTS if mode == "ok" else 50
            for i in range(n):
                await resp.write(chunk({"content": f"w{i} "}))
                if mode == "slow":
                    await asyncio.sleep(0.2)
                if mode == "break" and i == 2:
                    await asyncio.sleep(0.1)
                    assert request.transport is not None
                    request.transport.close()  # the upstream breaks mid-stream
                    return resp
            await resp.write(chunk({}, "stop"))
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                u = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
                u |= {"choices": [], "usage": usage}
                await resp.write(b"data: " + json.dumps(u).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp

        app.router.add_post("/v1/chat/completions", chat)


@pytest.fixture
def upstream() -> Iterator[Scripted]:
    with Scripted() as up:
        yield up


CASES = ["ok", "slow", "trickle", "err", "s-ok", "s-slow", "s-none", "s-err", "s-break"]


@pytest.fixture
def gw(
    upstream: Scripted,
    gateway: Callable[..., GatewayServer],
    redis_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> GatewayServer:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", ",".join(f"t-{c}:k-{c}" for c in CASES))
    return gateway(
        f"""
providers:
  p: {{base_url: 'http://127.0.0.1:{upstream.port}/v1', models: {{'*': m}},
       price: {{input_per_1m: 1000, output_per_1m: 2000}}}}
pools:
  main: {{members: [p], max_attempts: 1}}
models:
  chat: {{pool: main}}
""",
        redis_url=redis_url,
    )


async def _request(gw: GatewayServer, case: str) -> None:
    stream = case.startswith("s-")
    mode = case.removeprefix("s-")
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": f"{mode} {time.time()}"}],
        "max_tokens": 50,
        "stream": stream,
    }
    headers = {"authorization": f"Bearer k-{case}"}
    async with httpx.AsyncClient(timeout=10) as c:
        if not stream:
            if mode in ("slow", "trickle"):  # the client leaves while the provider answers
                with pytest.raises(httpx.ReadTimeout):
                    await c.post(
                        gw.base_url + "/chat/completions", json=body, headers=headers, timeout=0.5
                    )
                return
            await c.post(gw.base_url + "/chat/completions", json=body, headers=headers)
            return
        timeout = 0.5 if mode == "none" else 10
        try:
            async with c.stream(
                "POST",
                gw.base_url + "/chat/completions",
                json=body,
                headers=headers,
                timeout=timeout,
            ) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if mode == "slow" and seen >= 5:
                        return  # the client leaves mid-stream
        except httpx.ReadTimeout:
            assert mode == "none"


def _metric(text: str, family: str, tenant: str) -> float:
    pat = rf'^{family}{{[^}}]*tenant="{re.escape(tenant)}"[^}}]*}} (\S+)$'
    return sum(float(v) for v in re.findall(pat, text, re.M))


def test_spend_and_usage_metrics_agree_however_a_request_ends(gw: GatewayServer) -> None:
    async def run_all() -> None:
        await asyncio.gather(*(_request(gw, c) for c in CASES))

    asyncio.run(run_all())

    def spend() -> dict[str, dict[str, Any]]:
        doc = httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant"}).json()
        return {g["tenant"]: g for g in doc["groups"]}

    # Every request is recorded once (the ones whose client left, once the gateway noticed).
    poll(lambda: all(spend().get(f"t-{c}", {}).get("requests") == 1 for c in CASES), within_s=10)
    by_tenant = spend()
    text = httpx.get(gw.url + "/metrics").text
    charged = {}
    for case in CASES:
        s = by_tenant[f"t-{case}"]
        m = (
            _metric(text, "gateway_input_tokens_total", f"t-{case}"),
            _metric(text, "gateway_output_tokens_total", f"t-{case}"),
            _metric(text, "gateway_cost_usd_total", f"t-{case}"),
        )
        assert (s["input_tokens"], s["output_tokens"]) == (m[0], m[1]), case
        assert s["cost_usd"] == pytest.approx(m[2], abs=1e-9), case
        charged[case] = (s["input_tokens"], s["output_tokens"])
    # And what is charged follows the rule: the provider's usage when it arrived...
    assert charged["ok"] == charged["s-ok"] == (PROMPT_USAGE, COMPLETION_USAGE)
    # ... the prompt estimate when the client left before it did (unary, or a stream before
    # its first event) ...
    for case in ("slow", "trickle", "s-none"):
        assert charged[case][0] > 0 and charged[case][1] == 0, case
    # ... the content events relayed when a stream was cut (the client left, the upstream
    # broke) ...
    assert 1 <= charged["s-slow"][1] < 50
    assert 1 <= charged["s-break"][1] <= 3
    # ... and nothing when the provider failed.
    assert charged["err"] == charged["s-err"] == (0, 0)
