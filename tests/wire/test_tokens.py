"""Token estimation: exact for small inputs, bounded error and cost for huge ones."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from gateway.wire import tokens
from gateway.wire.tokens import (
    CL100K,
    IMAGE_TOKENS,
    O200K,
    count_text,
    encoding_for_model,
    estimate_chat_tokens,
    estimate_prompt,
    get_encoding,
)
from loadtests.classify_cost import KINDS

ROOT = Path(__file__).resolve().parents[2]


def exact(text: str, encoding: str = CL100K) -> int:
    return len(get_encoding(encoding).encode(text, disallowed_special=()))


def test_vocabularies_load_offline_into_a_fresh_cache(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    code = (
        "from gateway.wire.tokens import count_text;"
        "print(count_text('hello world', 'cl100k_base'), count_text('hello world', 'o200k_base'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "2"]
    folder = tmp_path / "llm-gateway" / "tiktoken"
    assert sorted(p.name for p in folder.iterdir()) == sorted(tokens._CACHE_NAMES.values())


@pytest.mark.parametrize("encoding", [CL100K, O200K])
def test_hello_world_is_two_tokens(encoding: str) -> None:
    assert count_text("hello world", encoding) == 2


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", O200K),
        ("gpt-4o-mini-2024-07-18", O200K),
        ("openai/gpt-4.1", O200K),
        ("o1-preview", O200K),
        ("o3-mini", O200K),
        ("gpt-5", O200K),
        ("ft:gpt-4o:org::id", O200K),
        ("gpt-4", CL100K),
        ("gpt-4-turbo", CL100K),
        ("gpt-3.5-turbo", CL100K),
        ("llama-3-70b", CL100K),
        (None, CL100K),
    ],
)
def test_encoding_for_model_family(model: str | None, encoding: str) -> None:
    assert encoding_for_model(model) == encoding


def test_small_texts_match_tiktoken_exactly() -> None:
    for text in ["", "Hello, world!", '{"a": [1, 2, 3]}', "你好，世界", "<|endoftext|> is text"]:
        for enc in (CL100K, O200K):
            assert count_text(text, enc) == exact(text, enc)


def test_unknown_encoding_is_rejected() -> None:
    with pytest.raises(ValueError):
        get_encoding("p50k_base_typo")


def test_chat_overhead_follows_openai_formula() -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "name": "bob", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    expected = 3  # reply priming
    for m in messages:
        expected += 3 + sum(exact(v) for v in m.values())
        expected += 1 if "name" in m else 0
    assert estimate_chat_tokens(messages) == expected


def test_content_parts_count_text_and_fixed_image_cost() -> None:
    parts = [
        {"type": "text", "text": "Describe this picture."},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    got = estimate_chat_tokens([{"role": "user", "content": parts}])
    assert got == 3 + exact("user") + exact("Describe this picture.") + IMAGE_TOKENS + 3


def test_tools_counted_from_their_json() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    diff = estimate_chat_tokens(msgs, tools) - estimate_chat_tokens(msgs)
    assert diff == exact(orjson.dumps(tools).decode())


def test_estimate_prompt_handles_every_body_shape() -> None:
    text = "量子计算 uses qubits."
    assert estimate_prompt({"model": "gpt-4o", "prompt": text}) == exact(text, O200K)
    assert estimate_prompt({"model": "gpt-4", "prompt": text}) == exact(text, CL100K)
    assert estimate_prompt({"prompt": ["a b", "c d"]}) == exact("a b") + exact("c d")
    assert estimate_prompt({"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt({"prompt": [[1, 2], [3]]}) == 3
    assert estimate_prompt({"input": "hello world"}) == 2
    assert estimate_prompt({"model": "gpt-4"}) == 0
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
    assert estimate_prompt(chat) == 3 + exact("user", O200K) + exact(text, O200K) + 3
    assert estimate_prompt(chat, encoding=CL100K) == 3 + exact("user") + exact(text) + 3


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bounded_estimate_of_100k_tokens_within_3_percent(kind: str) -> None:
    # ~100k tokens of each kind of text; the bound is checked against an exact count.
    chars = {"english": 525_000, "json": 274_000, "chinese": 94_000, "mixed": 185_000}[kind]
    text = KINDS[kind](chars, 5)
    truth = exact(text)
    assert truth > 80_000
    assert abs(count_text(text) - truth) / truth < 0.03


def test_bounded_estimate_cost_does_not_grow_with_prompt_size() -> None:
    text = KINDS["english"](2_000_000, 9)  # ~380k tokens
    body = {"model": "gpt-4", "messages": [{"role": "user", "content": text}]}

    def best_of(fn, n: int = 3) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    bounded = best_of(lambda: estimate_prompt(body))
    full = best_of(lambda: estimate_prompt(body, char_budget=0), 1)
    assert bounded < full / 10
    assert bounded < 0.05


def test_many_messages_share_one_budget() -> None:
    # 200 messages of 2k chars each: per-message counts would be exact but slow.
    msgs = [{"role": "user", "content": KINDS["english"](2_000, i)} for i in range(200)]
    truth = estimate_chat_tokens(msgs, char_budget=0)
    assert abs(estimate_chat_tokens(msgs) - truth) / truth < 0.03
