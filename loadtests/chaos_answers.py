"""Checking each answer of the chaos benchmark against what the upstream produced.

The simulator's text is deterministic: the words of an answer follow from the conversation (and
`seed`), its length from `max_tokens`. So every answer the gateway passes as a success can be
compared word for word with the text the simulator generates for the same request, whichever
member answered, whether it came from the cache, and whether a broken stream was resumed on
another member. Anything else with status 200 that is not marked degraded is a broken answer
passed as a success: the one outcome the gateway must never produce.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

from loadtests.simulator.jobs import chat_job
from loadtests.simulator.profiles import Profile, load_profiles
from loadtests.simulator.text import join_words, word_ids


@cache
def _profile(name: str) -> Profile:
    return load_profiles()[name]


def expected_text(body: dict[str, Any], profile: str = "low-latency") -> str:
    """The content the simulator generates for a chat request body."""
    job = chat_job(body, _profile(profile), "check")
    return join_words(word_ids(job.seed, job.start, job.n_out), job.first)


def unary_content(raw: bytes) -> str | None:
    """The first choice's content of a chat completion, None when it is not one."""
    try:
        doc = orjson.loads(raw)
        content = doc["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def stream_content(raw: bytes) -> tuple[str | None, bool]:
    """(content of a complete SSE chat stream or None, whether it carried an error event)."""
    parts: list[str] = []
    done = False
    for block in raw.split(b"\n\n"):
        block = block.strip()
        if not block:
            continue
        if not block.startswith(b"data: ") or done:
            return None, False
        data = block[6:]
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None, False
        if not isinstance(chunk, dict):
            return None, False
        if "error" in chunk:
            return None, True
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                parts.append(delta["content"])
    return ("".join(parts) if done else None), False


def classify(status: int, degraded: bool, raw: bytes, stream: bool, expected: str) -> str:
    """succeeded | degraded | shed | failed (an honest error) | broken (wrong content as a 200)."""
    if status == 429:
        return "shed"
    if status != 200:
        return "failed"
    if degraded:
        return "degraded"
    if stream:
        content, errored = stream_content(raw)
        if errored:
            return "failed"  # the stream said it failed: honest, not silent
    else:
        content = unary_content(raw)
    return "succeeded" if content == expected else "broken"
