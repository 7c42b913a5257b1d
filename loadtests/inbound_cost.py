"""What the inbound translation costs: Anthropic Messages and OpenAI Responses over plain chat.

Run: PYTHONPATH=. python -m loadtests.inbound_cost [--iterations 3000] [--requests 300]
     [--rounds 5]

1. The translation functions alone, in this process: for one realistic request (system prompt,
   four turns, one tool, ~300 words) the request translation (parse, translate, serialise) plus
   the answer translation (a 100-word completion: parse, translate, serialise, rebuild the
   response), and 16- and 50-chunk streams through the event translator (with the request). A chat request through the
   gateway pays none of this, so these times are the cost over pass-through.
2. Over HTTP: one `gateway serve` process in front of a zero-latency simulated provider (child
   process). Sequential requests (one client, keep-alive), unique prompts, interleaved round by
   round with the order rotated, plain and streamed, for /v1/chat/completions, /v1/messages and
   /v1/responses (`store: false`, and `store: true` kept in memory). Reported: p50 / p99 latency
   and the p50 added over chat.
3. The gateway's CPU time per request, in-process: the app behind its ASGI entry point (no HTTP
   server or client in the process; the same upstream in its own process), blocks of requests per
   target interleaved round by round; median of the blocks. The most precise whole-path figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import orjson
from starlette.responses import Response

from gateway.apis.exchange import translate_body
from gateway.apis.messages import MessagesExchange, MessageStream
from gateway.apis.response_store import ResponseStore
from gateway.apis.responses import ResponseEvents, ResponsesExchange
from gateway.context import Context
from gateway.infra.shared_state import SharedState
from loadtests.simulator.testing import spawn_fleet

WORDS = (
    "the gateway routes each request to a provider and keeps answering when one fails " * 4
).split()
TOOL = {
    "name": "get_weather",
    "description": "Weather",
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _text(n: int, salt: str = "") -> str:
    return salt + " " + " ".join(WORDS[i % len(WORDS)] for i in range(n))


def messages_body(salt: str = "", stream: bool = False) -> dict[str, Any]:
    turns = [
        {"role": "user", "content": _text(60, salt)},
        {"role": "assistant", "content": [{"type": "text", "text": _text(80)}]},
        {"role": "user", "content": [{"type": "text", "text": _text(60)}]},
    ]
    return {
        "model": "chat",
        "max_tokens": 16,
        "system": _text(40),
        "tools": [{"name": TOOL["name"], "description": "Weather", "input_schema": TOOL["schema"]}],
        "messages": turns,
        "stream": stream,
    }


def responses_body(salt: str = "", stream: bool = False, store: bool = False) -> dict[str, Any]:
    return {
        "model": "chat",
        "max_output_tokens": 16,
        "instructions": _text(40),
        "tools": [{"type": "function", "name": TOOL["name"], "parameters": TOOL["schema"]}],
        "input": [
            {"role": "user", "content": _text(60, salt)},
            {"role": "assistant", "content": _text(80)},
            {"role": "user", "content": [{"type": "input_text", "text": _text(60)}]},
        ],
        "stream": stream,
        "store": store,
    }


def chat_body(salt: str = "", stream: bool = False, usage: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "chat",
        "max_tokens": 16,
        "tools": [
            {"type": "function", "function": {"name": TOOL["name"], "parameters": TOOL["schema"]}}
        ],
        "messages": [
            {"role": "system", "content": _text(40)},
            {"role": "user", "content": _text(60, salt)},
            {"role": "assistant", "content": _text(80)},
            {"role": "user", "content": _text(60)},
        ],
        "stream": stream,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "sim",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": _text(100)},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 300, "completion_tokens": 100, "total_tokens": 400},
    }
)


def _chunks(n: int) -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "sim"}
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    out += [
        {**base, "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
        for i in range(n)
    ]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    out.append({**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in out) + b"data: [DONE]\n\n"


STREAM_16 = _chunks(16)  # what the zero-latency simulator sends
STREAM_50 = _chunks(50)


def _p50_us(fn: Callable[[], Any], iterations: int, loop: asyncio.AbstractEventLoop) -> float:
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        loop.run_until_complete(fn())
        times.append(time.perf_counter_ns() - t0)
    # the event loop's own cost of one run_until_complete, measured the same way, is removed
    empty = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        loop.run_until_complete(_nothing())
        empty.append(time.perf_counter_ns() - t0)
    return (statistics.median(times) - statistics.median(empty)) / 1000


async def _nothing() -> None:
    return None


def functions(iterations: int) -> list[tuple[str, float]]:
    loop = asyncio.new_event_loop()
    ctx = Context("bench", 0.0)
    ctx.prompt_tokens = 300
    store = ResponseStore(SharedState(None))
    m_raw = orjson.dumps(messages_body("x"))
    r_raw = orjson.dumps(responses_body("x"))
    r_stored = orjson.dumps(responses_body("x", store=True))

    async def messages_unary() -> None:
        x = MessagesExchange()
        await x.request(m_raw, ctx)
        await x.respond(Response(COMPLETION, media_type="application/json"), ctx)

    async def responses_unary(raw: bytes = r_raw) -> None:
        x = ResponsesExchange(store)
        await x.request(raw, ctx)
        await x.respond(Response(COMPLETION, media_type="application/json"), ctx)

    async def responses_stored() -> None:
        await responses_unary(r_stored)

    async def messages_stream(body: bytes = STREAM_50) -> None:
        x = MessagesExchange()
        await x.request(m_raw, ctx)
        await translate_body(body, MessageStream("chat", 300))

    async def responses_stream(body: bytes = STREAM_50) -> None:
        x = ResponsesExchange(store)
        await x.request(r_raw, ctx)
        await translate_body(body, ResponseEvents(x, ctx))

    async def messages_stream_16() -> None:
        await messages_stream(STREAM_16)

    async def responses_stream_16() -> None:
        await responses_stream(STREAM_16)

    rows = [
        ("messages: request + answer", messages_unary),
        ("responses: request + answer (store: false)", responses_unary),
        ("responses: request + answer + store in memory", responses_stored),
        ("messages: request + 16-chunk stream", messages_stream_16),
        ("responses: request + 16-chunk stream", responses_stream_16),
        ("messages: request + 50-chunk stream", messages_stream),
        ("responses: request + 50-chunk stream", responses_stream),
    ]
    for _, fn in rows:  # warm-up
        for _ in range(200):
            loop.run_until_complete(fn())
    out = [(name, _p50_us(fn, iterations, loop)) for name, fn in rows]
    loop.close()
    return out


# -- HTTP ---------------------------------------------------------------------------------------


def _policy(upstream: str) -> str:
    return f"""
providers:
  zero: {{base_url: '{upstream}', models: {{'*': sim}}, max_inflight: 512}}
pools:
  main: {{members: [zero]}}
models:
  chat: {{pool: main}}
"""


@contextlib.contextmanager
def _gateway(policy: Path, log: Path) -> Iterator[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    cmd += ["--policy", str(policy), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "GATEWAY_ACCESS_LOG": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


TARGETS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "chat": ("/v1/chat/completions", lambda s: chat_body(s)),
    "messages": ("/v1/messages", lambda s: messages_body(s)),
    "responses": ("/v1/responses", lambda s: responses_body(s)),
    "responses store": ("/v1/responses", lambda s: responses_body(s, store=True)),
    "chat stream": ("/v1/chat/completions", lambda s: chat_body(s, True)),
    # What the translated streams send upstream: usage asked for (message_delta / completed need it).
    "chat stream + usage": ("/v1/chat/completions", lambda s: chat_body(s, True, True)),
    "messages stream": ("/v1/messages", lambda s: messages_body(s, True)),
    "responses stream": ("/v1/responses", lambda s: responses_body(s, True)),
}


async def http_compare(base: str, requests: int, rounds: int) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {name: [] for name in TARGETS}
    names = list(TARGETS)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:

        async def one(name: str) -> float:
            path, make = TARGETS[name]
            body = orjson.dumps(make(uuid.uuid4().hex))
            t0 = time.perf_counter()
            async with client.stream(
                "POST", path, content=body, headers={"content-type": "application/json"}
            ) as r:
                async for _ in r.aiter_raw():
                    pass
            if r.status_code != 200:
                raise RuntimeError(f"{name}: {r.status_code}")
            return time.perf_counter() - t0

        for name in names:  # warm-up
            for _ in range(30):
                await one(name)
        per = max(1, requests // rounds)
        for r in range(rounds):
            k = r % len(names)
            for _ in range(per):
                for name in names[k:] + names[:k]:  # interleaved request by request
                    lat[name].append(await one(name))
    return lat


async def asgi_cpu(upstream: str, requests: int, rounds: int) -> dict[str, float]:
    """The gateway's CPU time per request (median over blocks), in this process: the app behind
    its real ASGI entry point, no HTTP server or client in the process (the upstream is another
    process), so `time.process_time` is the gateway's own work."""
    from gateway.http.app import create_app
    from gateway.http.server import FastRoutes
    from gateway.infra.shared_state import SharedState
    from gateway.policy.loader import parse_policy

    app = create_app(parse_policy(_policy(upstream)), SharedState(None))
    entry = FastRoutes(app)

    async def one(name: str) -> None:
        path, make = TARGETS[name]
        body = orjson.dumps(make(uuid.uuid4().hex))
        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
            "http_version": "1.1",
            "scheme": "http",
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 1),
        }
        received = False
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # never disconnects
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await entry(scope, receive, send)
        if status != [200]:
            raise RuntimeError(f"{name}: {status}")

    names = list(TARGETS)
    blocks: dict[str, list[float]] = {n: [] for n in names}
    per = max(1, requests // rounds)
    async with app.router.lifespan_context(app):
        for n in names:
            for _ in range(30):
                await one(n)
        for r in range(rounds):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                t0 = time.process_time()
                for _ in range(per):
                    await one(n)
                blocks[n].append((time.process_time() - t0) / per)
    return {n: 1000 * statistics.median(v) for n, v in blocks.items()}


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iterations", type=int, default=3000, help="per translation function")
    p.add_argument("--requests", type=int, default=300, help="HTTP requests per target")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cpu-requests", type=int, default=500, help="in-process, per target")
    args = p.parse_args(argv)
    print("## Translation functions (p50 per request, microseconds)\n")
    print("| what | p50 µs |\n|---|---|")
    for name, us in functions(args.iterations):
        print(f"| {name} | {us:.1f} |")
    tmp = Path(tempfile.mkdtemp(prefix="inbound-cost-"))
    with spawn_fleet([{"name": "zero", "profile": "zero-latency"}]) as fleet:
        policy = tmp / "policy.yaml"
        policy.write_text(_policy(fleet.url("zero")))
        with _gateway(policy, tmp / "gateway.log") as base:
            lat = asyncio.run(http_compare(base, args.requests, args.rounds))
        os.environ["GATEWAY_ACCESS_LOG"] = "0"
        cpu = asyncio.run(asgi_cpu(fleet.url("zero"), args.cpu_requests, args.rounds * 2))
    print(f"\n## HTTP, one client, zero-latency upstream ({args.requests} requests per target)\n")
    print(
        "| target | p50 ms | p99 ms | p50 added ms | gateway CPU ms/req (in-process) "
        "| CPU added ms/req |\n|---|---|---|---|---|---|"
    )
    for name, values in lat.items():
        ref = "chat" if "stream" not in name else "chat stream + usage"
        if name.startswith("chat"):
            ref = "chat stream" if "stream" in name else "chat"
        added = _pct(values, 0.5) - _pct(lat[ref], 0.5)
        print(
            f"| {name} | {_pct(values, 0.5):.3f} | {_pct(values, 0.99):.3f} | {added:+.3f} "
            f"| {cpu[name]:.3f} | {cpu[name] - cpu[ref]:+.3f} |"
        )
    print(
        "\n(added: over `chat` for unary rows, over `chat stream + usage` for translated streams,"
    )
    print("which ask the provider for usage too; `chat stream + usage` over `chat stream`)")


if __name__ == "__main__":
    main()
