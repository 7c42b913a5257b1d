"""Cost of checking upstream answers on the hot path (gateway/wire/answer_checks.py, gateway/redact.py).

Run: PYTHONPATH=. python -m loadtests.answer_checks_cost [--iterations 20000]

Per unary answer: the one JSON parse and shape check, plus the secret redaction of the relayed
bytes, for a typical chat completion (~0.6 KB), a long one (~40 KB) and an embeddings batch (~1 MB).
Per stream event: the splitter alone (what the relay did before) and the splitter plus the stream
checks (end marker, error events, UTF-8, redaction), for ASCII and non-ASCII content; per read of
a whole answer (20 events), the checks event by event and as one block (the relay's usual path). Also the cost
of sanitising an upstream error message (error path only). Prints median microseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson

from gateway.redact import Redactor, sanitize_message
from gateway.wire.answer_checks import ResponseLimits, StreamCheck, check_unary
from gateway.wire.sse import SSESplitter

SECRETS = [
    "sk-provider-a-0123456789abcdef",
    "sk-provider-b-0123456789abcdef",
    "Bearer tok-12345678",
]


def _chat(words: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "word " * words},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": words + 10},
        }
    )


def _embeddings(n: int, dims: int) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": [0.0123456] * dims} for i in range(n)]
    return orjson.dumps({"object": "list", "data": data, "model": "e"})


def _event(text: str) -> bytes:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _median_us(fn: Callable[[], object], iterations: int) -> float:
    samples = []
    batch = max(1, iterations // 50)
    for _ in range(50):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch)
    return statistics.median(samples) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=20000)
    args = ap.parse_args()
    n = args.iterations
    redactor = Redactor(SECRETS)
    print("unary answer                      parse+shape  +redaction (us)")
    for name, body, endpoint, scale in [
        ("chat, 0.6 KB", _chat(80), "chat", 1),
        ("chat, 40 KB", _chat(8000), "chat", 10),
        ("embeddings, 64x1536", _embeddings(64, 1536), "embeddings", 200),
    ]:
        parse = _median_us(lambda b=body, e=endpoint: check_unary(e, b), n // scale)
        # As the relay does: the one parse, then the redaction of the answer it parsed.
        both = _median_us(
            lambda b=body, e=endpoint: redactor.json(b, check_unary(e, b)), n // scale
        )
        print(f"  {name:30s} {parse:10.2f} {both:10.2f}   ({len(body) / 1024:.0f} KB)")

    limits = ResponseLimits()
    print("stream event (one event per read)  splitter  +checks (us)")
    for name, ev in [("ASCII", _event("hello there")), ("non-ASCII", _event("héllo 世界"))]:
        split = SSESplitter()
        base = _median_us(lambda e=ev, s=split: s.feed(e), n)
        split2 = SSESplitter(limits.max_event_bytes)
        check = StreamCheck(limits, redactor)

        def checked(e: bytes = ev, s: SSESplitter = split2, c: StreamCheck = check) -> None:
            c.count(len(e))
            for x in s.feed(e):
                c.event(x)

        full = _median_us(checked, n)
        print(f"  {name:30s} {base:10.2f} {full:10.2f}")

    # A read that brings a whole answer (20 events and `[DONE]`, as a fast upstream sends them):
    # the checks event by event against the relay's block path (one set of scans per read).
    read = b"".join(_event(f"word {i} ") for i in range(20)) + b"data: [DONE]\n\n"

    def by_event() -> None:
        c = StreamCheck(limits, redactor)
        c.count(len(read))
        c.events(SSESplitter(limits.max_event_bytes).feed(read))

    def by_block() -> None:
        c = StreamCheck(limits, redactor)
        c.count(len(read))
        block = SSESplitter(limits.max_event_bytes).feed_block(read)
        assert c.block(block) == 21

    print("a read of 20 events + [DONE]       by event  by block (us)")
    print(
        f"  {'ASCII, ' + str(len(read)) + ' bytes':30s} {_median_us(by_event, n // 10):10.2f} "
        f"{_median_us(by_block, n // 10):10.2f}"
    )
    message = (
        "Incorrect API key provided: sk-proj-****abcd. See https://platform.example.com/keys "
        "(request from 10.0.0.7 via gpu-3.internal:8000)."
    )
    err = _median_us(lambda: sanitize_message(message, redactor, ("10.0.0.7",)), n // 10)
    print(f"sanitise an upstream error message: {err:.2f} us (error path only)")


if __name__ == "__main__":
    main()
