"""CPU cost of the bedrock adapter's work per request, which a pass-through provider does not do.

    python -m loadtests.bedrock_cost [--n 5000]

Times, one call at a time (median and p90 of --n runs, microseconds): `request()` (OpenAI chat ->
Converse body, its JSON, and the SigV4 signature by botocore, reported apart too), `response()`
(a Converse answer of 64 words -> OpenAI JSON), and the translation of a whole ConverseStream of
64 text deltas (event stream decoding by botocore + chunk rendering), per stream and per event.
No network: the hooks are called directly on an adapter built from a policy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import orjson

from gateway.policy.loader import parse_policy
from gateway.providers.registry import make_adapter
from loadtests.simulator.bedrock import event_message

POLICY = """
providers:
  br:
    type: bedrock
    base_url: https://bedrock-runtime.us-east-1.amazonaws.com
    models: {chat: anthropic.claude-3-5-haiku-20241022-v1:0}
pools:
  p: {members: [br]}
models:
  chat: {pool: p}
"""
BODY = {
    "model": "chat",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "Tell me about the harbor timetable on Sundays. " * 4},
    ],
    "max_tokens": 64,
    "temperature": 0.3,
}
WORDS = 64


def _answer() -> bytes:
    text = " ".join(["word"] * WORDS)
    return orjson.dumps(
        {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 60, "outputTokens": WORDS, "totalTokens": 60 + WORDS},
            "metrics": {"latencyMs": 100},
        }
    )


def _stream() -> list[bytes]:
    events = [event_message("messageStart", {"role": "assistant"})]
    for i in range(WORDS):
        delta = {"contentBlockIndex": 0, "delta": {"text": " word" if i else "word"}}
        events.append(event_message("contentBlockDelta", delta))
    events.append(event_message("contentBlockStop", {"contentBlockIndex": 0}))
    events.append(event_message("messageStop", {"stopReason": "end_turn"}))
    usage = {"inputTokens": 60, "outputTokens": WORDS, "totalTokens": 60 + WORDS}
    events.append(event_message("metadata", {"usage": usage, "metrics": {"latencyMs": 100}}))
    return events


def _time(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(min(200, n)):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.9)] * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=5000)
    args = p.parse_args()
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDBENCH",
        "AWS_SECRET_ACCESS_KEY": "bench-secret",
        "AWS_REGION": "us-east-1",
    }
    os.environ.update(env)
    policy = parse_policy(POLICY, env=env)
    adapter = make_adapter(policy.providers["br"], None)
    model = policy.providers["br"].model_for("chat")
    answer, events = _answer(), _stream()
    signer = adapter._signer  # type: ignore[attr-defined]
    converse = adapter.request("chat", BODY, model, False).body

    def whole_stream() -> None:
        translate = adapter.stream("chat", BODY, model)
        for e in events:
            translate(e)

    rows = [
        ("request(): map + JSON + SigV4", lambda: adapter.request("chat", BODY, model, False)),
        ("  of which SigV4 signing (botocore)", lambda: signer.headers("https://h/x", converse)),
        ("response(): 64-word answer", lambda: adapter.response("chat", answer, model)),
        (f"stream: {len(events)} events", whole_stream),
    ]
    print(f"{'what':40} {'p50 us':>9} {'p90 us':>9}")
    for name, fn in rows:
        p50, p90 = _time(fn, args.n)
        print(f"{name:40} {p50:9.1f} {p90:9.1f}")
    p50, _ = _time(whole_stream, args.n // 4 or 1)
    print(f"{'  per stream event':40} {p50 / len(events):9.2f}")


if __name__ == "__main__":
    main()
