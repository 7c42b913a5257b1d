"""Cost of accepting a request body (parse + checks), per body shape: a timeit micro-benchmark.

    python -m loadtests.accept_bench            # best of 7 runs of 20,000 calls per shape

Bodies: a one-message chat; a 10-message chat with the usual sampling fields and a stream;
8 function tools with a `json_schema` response format. Nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import timeit

import orjson

from gateway.wire.request import parse_request

BODIES: dict[str, bytes] = {
    "small": orjson.dumps({"model": "demo", "messages": [{"role": "user", "content": "Hi there"}]}),
    "typical-10msg": orjson.dumps(
        {
            "model": "demo",
            "temperature": 0.7,
            "max_tokens": 256,
            "stream": True,
            "stream_options": {"include_usage": True},
            "top_p": 0.9,
            "seed": 1,
            "stop": ["\n\n"],
            "messages": [{"role": "system", "content": "You are helpful."}]
            + [
                {"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 40}
                for i in range(10)
            ],
        }
    ),
    "8-tools+schema": orjson.dumps(
        {
            "model": "demo",
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": f"fn_{i}",
                        "description": "d",
                        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
                    },
                }
                for i in range(8)
            ],
            "tool_choice": "auto",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            },
        }
    ),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--number", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    for name, raw in BODIES.items():

        def once(raw: bytes = raw) -> None:
            parse_request(raw, "chat")

        runs = timeit.repeat(once, number=args.number, repeat=args.repeat)
        print(f"{name:16s} {min(runs) / args.number * 1e6:7.2f} µs")


if __name__ == "__main__":
    main()
