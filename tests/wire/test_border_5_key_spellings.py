"""A provider key quoted in any case (upper-cased, lower-cased, capitalised at the start of a
sentence, cases swapped) or in hexadecimal (lower or upper case digits) in an answer is masked
like the key itself: in a unary answer and in a stream, whole or cut
into pieces of any size, in every text a chunk carries, through every API
(/v1/chat/completions, /v1/completions, /v1/messages, /v1/responses).

Official-shaped answers -> gateway (the key configured for the provider) -> client, which reads
the text back: no run of 8 characters of any spelling of the key past its public prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.redact import Redactor, sanitize_message
from tests.support import GatewayServer
from tests.wire.test_stream_border_4_encoded import _read, post_mode, stream_scripts
from tests.wire.test_stream_border_upstream import Scripted, scripted_policy

KEY = "sk-Zq8vN3xK7p/L2mW9rT4+yB6cD1fG5hJ0aE"
FORMS = {
    "upper": KEY.upper(),
    "lower": KEY.lower(),
    "capitalised": "S" + KEY[1:],
    "swapped": KEY.swapcase(),
    "hex": KEY.encode().hex(),
    "HEX": KEY.encode().hex().upper(),
}
FIELDS = ["content", "reasoning_content", "tool_args", "text"]
SIZES: list[int | str] = [1, "two"]
MSG = [{"role": "user", "content": "hi"}]
# What the client must not read: 8 characters of a spelling past the key's public prefix (`sk-`,
# six hex digits).
SPELLINGS = [FORMS[f][3:] for f in ("upper", "lower", "swapped")] + [
    FORMS["hex"][6:],
    FORMS["HEX"][6:],
]
RUNS = {s[i : i + 8] for s in SPELLINGS for i in range(len(s) - 7)}


def _unary_chat(text: str, tool: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": f"before {text} after"}
    if tool:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": json.dumps({"k": text})},
                }
            ],
        }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _unary_text(text: str) -> dict[str, Any]:
    choice = {"index": 0, "text": f"before {text} after", "logprobs": None, "finish_reason": "stop"}
    return {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}


SCRIPTS = stream_scripts(FORMS, FIELDS, SIZES)
for _form, _text in FORMS.items():
    SCRIPTS[f"content.{_form}.unary"] = [_unary_chat(_text, tool=False)]
    SCRIPTS[f"tool_args.{_form}.unary"] = [_unary_chat(_text, tool=True)]
    SCRIPTS[f"text.{_form}.unary"] = [_unary_text(_text)]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Scripted(SCRIPTS) as up:
        text = scripted_policy(up, list(SCRIPTS), provider=", api_key_env: BORDER_5_KEY")
        with GatewayServer(text, env={"BORDER_5_KEY": KEY}) as server:
            yield server


def _leaks(text: str) -> list[str]:
    return [run for run in RUNS if run in text]


def _assert_masked(r: httpx.Response, got: str) -> None:
    assert r.status_code == 200, r.text
    assert not _leaks(got) and not _leaks(r.text), got
    assert "before " in got and " after" in got and "[redacted]" in got, got


@pytest.mark.parametrize("mode", [m for m in SCRIPTS if not m.endswith(".unary")])
def test_a_cased_or_hex_key_cut_into_pieces_is_masked_in_a_stream(
    gw: GatewayServer, mode: str
) -> None:
    r = post_mode(gw, mode, stream=True)
    _assert_masked(r, _read(r.content))


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("field", ["content", "tool_args", "text"])
def test_a_cased_or_hex_key_is_masked_in_a_unary_answer(
    gw: GatewayServer, form: str, field: str
) -> None:
    r = post_mode(gw, f"{field}.{form}.unary", stream=False)
    choice = r.json()["choices"][0]
    if field == "text":
        got = choice["text"]
    elif field == "content":
        got = choice["message"]["content"]
    else:
        got = "before " + choice["message"]["tool_calls"][0]["function"]["arguments"] + " after"
    _assert_masked(r, got)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("stream", [False, True])
def test_a_cased_or_hex_key_is_masked_in_the_messages_and_responses_apis(
    gw: GatewayServer, form: str, stream: bool
) -> None:
    model = f"content.{form}.{'two' if stream else 'unary'}"
    r = httpx.post(
        gw.base_url + "/messages",
        json={"model": model, "max_tokens": 64, "stream": stream, "messages": MSG},
        timeout=10,
    )
    got = _read(r.content) if stream else r.json()["content"][0]["text"]
    _assert_masked(r, got)
    r = httpx.post(
        gw.base_url + "/responses",
        json={"model": model, "stream": stream, "input": "hi"},
        timeout=10,
    )
    got = _read(r.content) if stream else r.json()["output"][0]["content"][0]["text"]
    _assert_masked(r, got)


def test_every_spelling_is_masked_by_the_redactor() -> None:
    red = Redactor([KEY])
    for form in FORMS.values():
        assert red.text(f"a {form} b") == "a [redacted] b"
        assert red.plain(f"a {form} b".encode()) == b"a [redacted] b"
        assert red.may_hold(f"x {form[:24]}".encode())
    # A key's public prefix in any case, and ordinary hex, are not part of a key.
    assert not red.may_hold(b"SK-PROJ- and sk- and 736b2d and deadbeefcafe0123")


def test_a_short_cased_key_in_an_upstream_error_message_is_masked() -> None:
    # Shorter than the 32 characters that make any opaque token look like a key.
    short = "aBcDeFgH1jKlMnOp"
    red = Redactor([short])
    for form in (short.upper(), short.lower(), short.encode().hex()):
        got = sanitize_message(f"invalid key {form} given", red)
        assert got == "invalid key [redacted] given", got
