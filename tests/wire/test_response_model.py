"""The `model` member of answers: the alias by default, the provider's id on request."""

from __future__ import annotations

from gateway.wire.response_model import ModelName, for_alias


def test_rewrites_the_top_level_model_only() -> None:
    rename = ModelName("demo")
    body = (
        b'{"id":"x","model":"sim-small","choices":[{"message":{"content":"\\"model\\":\\"y\\""}}]}'
    )
    out = rename(body)
    assert out.startswith(b'{"id":"x","model":"demo","choices"')
    assert out.endswith(b'{"content":"\\"model\\":\\"y\\""}}]}')
    spaced = b'data: {"id": "x", "model" : "gpt-4o-2024-08-06", "choices": []}\n\n'
    assert rename(spaced) == b'data: {"id": "x", "model":"demo", "choices": []}\n\n'
    # Already the alias, or no model at all: the same bytes.
    same = b'{"model": "demo"}'
    assert rename(same) is same
    assert rename(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    # A text that only mentions a model, with its quotes escaped, is not touched.
    text = b'{"choices":[{"text":"say \\"model\\": \\"q\\""}]}'
    assert rename(text) == text


def test_escapes_the_alias_and_follows_the_setting() -> None:
    assert ModelName('a"b')(b'{"model":"x"}') == b'{"model":"a\\"b"}'
    assert for_alias("provider", "demo") is None
    assert for_alias("alias", "demo") is not None


def test_later_stream_events_reuse_the_first_match() -> None:
    rename = ModelName("demo")
    ev = b'data: {"id":"c","model":"sim-small","choices":[{"delta":{"content":"%d"}}]}\n\n'
    outs = [rename(ev % i) for i in range(3)]
    assert all(o == (ev % i).replace(b"sim-small", b"demo") for i, o in enumerate(outs))
    assert rename(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
