"""Degradation rules: validation, matching, rendering against the OpenAI schemas, hot reload."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import jsonschema
import orjson
import pytest

from gateway.resilience.degrade_rules import (
    BUILTIN_DEFAULT,
    DegradeContext,
    RuleFileError,
    RuleStore,
    last_user_text,
    load_rules,
    render,
    render_json,
    render_sse,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "tests" / "data" / "openai_schemas.json"


def validator(name: str) -> jsonschema.Draft202012Validator:
    """The official OpenAI schema ``name`` (a copy ships with the tests)."""
    return jsonschema.Draft202012Validator(json.loads(SCHEMAS.read_text())["schemas"][name])


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


BASIC = """
rules:
  - name: vip
    match: {tenants: [ACME]}
    template: "vip {tenant}"
  - name: words
    match: {keywords: [Refund, invoice], aliases: [gpt-4o]}
    template: "billing {alias}"
  - name: pattern
    match: {regex: '(?i)\\border\\s+#?\\d+'}
    template: "order"
  - name: long
    match: {classes: [long]}
    queue: true
    template: "queued {request_id}"
default:
  template: "sorry {alias}, retry in {retry_after_s}s"
"""


def test_match_order_and_criteria(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", BASIC)
    rules = load_rules(tmp_path)
    m = rules.match
    assert m("gpt-4o", "long", "acme", "refund please").name == "vip"  # first match wins
    assert m("GPT-4o", "interactive", "t1", "I want a REFUND").name == "words"
    assert m("llama", "interactive", "t1", "I want a refund").name == "default"  # alias differs
    assert m("llama", "interactive", "t1", "where is Order #123?").name == "pattern"
    assert m("llama", "long", "t1", "hello").name == "long"
    assert m("llama", "interactive", "t1", "hello").name == "default"


def test_files_in_name_order_and_builtin_default(tmp_path: Path) -> None:
    write(tmp_path, "20-b.yaml", "rules: [{name: b, match: {keywords: [x]}, template: b}]")
    write(tmp_path, "10-a.yml", "rules: [{name: a, match: {keywords: [x]}, template: a}]")
    write(tmp_path, "notes.txt", "ignored")
    rules = load_rules(tmp_path)
    assert [r.name for r in rules.rules] == ["a", "b"]
    assert rules.match("m", "c", "t", "nothing") is None
    store = RuleStore(tmp_path)
    store.reload()
    assert store.match("m", "c", "t", "nothing") is BUILTIN_DEFAULT


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("rules: [{name: r, match: {regex: '('}, template: t}]", "rules[0].match.regex", "regular"),
        ("rules: [{name: r, match: {}, template: t}]", "rules[0].match", "criterion"),
        (
            "rules: [{name: r, match: {keywords: [a]}, template: '{oops}'}]",
            "rules[0].template",
            "oops",
        ),
        (
            "rules: [{name: r, match: {keywords: [a]}, template: t, colour: red}]",
            "rules[0].colour",
            "xtra",
        ),
        (
            "rules: [{name: r, match: {keyword: [a]}, template: t}]",
            "rules[0].match.keyword",
            "xtra",
        ),
        ("default: {template: t, status: 99}", "default.status", "greater"),
        ("default: {template: '{alias.__class__}'}", "default.template", "alias.__class__"),
        ("rules: [{name: r, template: t}]", "rules[0].match", "required"),
        ("rules:\n  - name: [unclosed", "line", "YAML"),
    ],
)
def test_validation_errors_name_file_and_field(
    tmp_path: Path, text: str, field: str, problem: str
) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(RuleFileError) as info:
        load_rules(tmp_path)
    err = info.value
    assert err.file == str(path)
    assert err.field_path.startswith(field)
    assert problem in str(err) and str(path) in str(err)


def test_duplicate_names_and_defaults_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "rules: [{name: r, match: {keywords: [a]}, template: t}]")
    write(tmp_path, "b.yaml", "rules: [{name: r, match: {keywords: [b]}, template: t}]")
    with pytest.raises(RuleFileError, match=r"b\.yaml: rules\[0\]\.name"):
        load_rules(tmp_path)
    (tmp_path / "b.yaml").write_text("default: {template: x}")
    write(tmp_path, "c.yaml", "default: {template: y}")
    with pytest.raises(RuleFileError, match=r"c\.yaml: default: .*b\.yaml"):
        load_rules(tmp_path)


def test_shipped_rules_load() -> None:
    rules = load_rules(ROOT / "fallbacks")
    assert rules.default is not None
    assert rules.match("m", "batch", "t", "hi").queue  # type: ignore[union-attr]


def test_render_json_is_a_valid_chat_completion() -> None:
    rule = load_rules(ROOT / "fallbacks").default
    assert rule is not None
    ctx = DegradeContext(alias="gpt-4o", request_id="req-1", retry_after_s=12.2)
    body = orjson.loads(render_json(rule, ctx))
    validator("CreateChatCompletionResponse").validate(body)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["model"] == "gpt-4o" and "req-1" in body["id"]
    text = body["choices"][0]["message"]["content"]
    assert "gpt-4o" in text and "13 seconds" in text and "req-1" in text


def test_render_sse_chunks_are_valid() -> None:
    rule = load_rules(ROOT / "fallbacks").default
    assert rule is not None
    ctx = DegradeContext(alias="m", request_id="r2")
    events = render_sse(rule, ctx, include_usage=True)
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    v = validator("CreateChatCompletionStreamResponse")
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        v.validate(chunk)
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["total_tokens"] == 0
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:3])
    assert "30 seconds" in text  # the rule's own retry_after_s when the gateway knows none
    assert len({c["id"] for c in chunks}) == 1


def test_render_error_status_and_headers(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", BASIC.replace('template: "order"', "status: 503\n    template: o"))
    rule = load_rules(tmp_path).match("m", "c", "t", "order 5")
    assert rule is not None and rule.status == 503
    resp = render(rule, DegradeContext("m", "r3", retry_after_s=4), stream=True)
    assert resp.status == 503 and resp.chunks == [] and resp.body is not None
    assert resp.headers["retry-after"] == "4" and resp.headers["x-gateway-degraded"] == "pattern"
    validator("ErrorResponse").validate(orjson.loads(resp.body))
    streamed = render(
        load_rules(tmp_path).match("m", "long", "t", "x"), DegradeContext("m", "r"), True
    )  # type: ignore[arg-type]
    assert (
        streamed.queue
        and streamed.chunks
        and streamed.headers["content-type"] == "text/event-stream"
    )


async def wait_until(pred, within: float) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + within
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


async def test_hot_reload_valid_then_invalid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.resilience.degrade_rules")
    write(tmp_path, "a.yaml", "default: {template: one}")
    store = RuleStore(tmp_path, debounce_ms=50)
    await store.start()
    try:
        assert store.match("m", "c", "t", "x").template == "one"
        write(tmp_path, "a.yaml", "default: {template: two}")
        await wait_until(lambda: store.match("m", "c", "t", "x").template == "two", within=5)
        version = store.version
        assert version >= 2
        write(tmp_path, "b.yaml", "rules: [{name: r, match: {regex: '[a-'}, template: t}]")
        await wait_until(lambda: store.last_error is not None, within=5)
        assert store.version == version and store.match("m", "c", "t", "x").template == "two"
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("b.yaml: rules[0].match.regex" in line for line in logged)
        (tmp_path / "b.yaml").unlink()
        await wait_until(lambda: store.version > version and store.last_error is None, within=5)
    finally:
        await store.stop()


def test_last_user_text() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url"}]},
    ]
    assert last_user_text(messages) == "see"
    assert last_user_text(messages[:3]) == "first"
    assert last_user_text(None) == "" and last_user_text([{"role": "system"}]) == ""
