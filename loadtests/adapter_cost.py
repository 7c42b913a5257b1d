"""CPU cost of the provider adapters' mapping, per request and per stream event.

Run: PYTHONPATH=. python -m loadtests.adapter_cost [--iterations 20000]

Per request: what the dispatcher does for one unary attempt besides the HTTP call. For `openai`
(pass-through) that is the body with the model replaced, serialised; for `anthropic` it is the
Messages request built and serialised plus the answer mapped back into a chat completion. Per
stream event: one Anthropic `content_block_delta` event translated into an OpenAI chunk (an
`openai` stream relays its events untouched, so it costs nothing here). The chat request is a
system prompt, three turns and one tool; the answer ~60 words with usage. Prints p50/p99 over
batches of 100 calls, in microseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.policy.schema import Provider
from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.settings import AnthropicSettings

WORDS = ("the gateway routes each request to the member with the lowest expected cost " * 5).split()
BODY: dict[str, Any] = {
    "model": "chat",
    "max_tokens": 256,
    "messages": [
        {"role": "system", "content": "You are a concise assistant for operators. " * 8},
        {"role": "user", "content": "How do pools fail over when a provider is down?"},
        {"role": "assistant", "content": " ".join(WORDS[:40])},
        {"role": "user", "content": "And what happens to a stream that breaks half-way?"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_status",
                "description": "Status of a pool",
                "parameters": {
                    "type": "object",
                    "properties": {"pool": {"type": "string"}},
                    "required": ["pool"],
                },
            },
        }
    ],
    "stream_options": {"include_usage": True},
}
ANSWER = orjson.dumps(
    {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": " ".join(WORDS[:60])}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 120, "cache_read_input_tokens": 400, "output_tokens": 60},
    }
)
DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":" expected"}}\n\n'
)
START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_01",'
    b'"model":"claude-x","usage":{"input_tokens":120,"output_tokens":1}}}\n\n'
)


def _passthrough() -> None:
    body = {**BODY, "model": "gpt-4o"}
    orjson.dumps(body)


def _measure(fn: Callable[[], object], iterations: int, batch: int = 100) -> tuple[float, float]:
    """(p50, p99) microseconds per call over batches of `batch` calls."""
    for _ in range(batch * 5):
        fn()
    per_call: list[float] = []
    for _ in range(max(1, iterations // batch)):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter_ns() - t0) / batch / 1000)
    per_call.sort()
    return statistics.median(per_call), per_call[min(len(per_call) - 1, int(len(per_call) * 0.99))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=20000)
    args = ap.parse_args()
    p50, p99 = _measure(_passthrough, args.iterations)
    print(f"{'openai pass-through: request body':58s} p50 {p50:7.2f} us   p99 {p99:7.2f} us")
    for cache_prefix in (False, True):
        cfg = Provider(
            type="anthropic",
            base_url="https://api.anthropic.com",
            anthropic=AnthropicSettings(cache_prefix=cache_prefix),
        )
        adapter = AnthropicAdapter(cfg, "k")

        def request() -> None:
            adapter.request("chat", BODY, "claude-x", False)  # noqa: B023
            adapter.response("chat", ANSWER, "claude-x")  # noqa: B023

        translate = adapter.stream("chat", BODY, "claude-x")
        translate(START)
        rows = [
            (
                f"anthropic request + answer (cache_prefix={cache_prefix})",
                _measure(request, args.iterations),
            ),
            (
                "anthropic stream event (text delta)",
                _measure(lambda: translate(DELTA), args.iterations),  # noqa: B023
            ),
        ]
        for name, (p50, p99) in rows:
            print(f"{name:58s} p50 {p50:7.2f} us   p99 {p99:7.2f} us")


if __name__ == "__main__":
    main()
