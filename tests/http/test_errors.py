"""Every error a client can get is OpenAI-shaped, with the right status, and leaks nothing."""

from __future__ import annotations

import hashlib
import logging

import httpx
import openai
import pytest

from tests.support import validate

SECRET = "sk-provider-secret-0123456789"


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    validate("ErrorResponse", body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "detail" not in body
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]


@pytest.fixture
def gw(fleet, gateway, monkeypatch):
    monkeypatch.setenv("SIM_SECRET", SECRET)
    return gateway(
        f"""
server: {{max_body_bytes: 4096}}
providers:
  a: {{base_url: '{fleet.url("a")}', api_key_env: SIM_SECRET}}
  dead: {{base_url: 'http://127.0.0.1:9/v1', api_key_env: SIM_SECRET, timeouts: {{connect_s: 0.5}}}}
  c: {{base_url: '{fleet.url("c")}', api_key_env: SIM_SECRET, timeouts: {{first_byte_s: 0.3, total_s: 0.5}}}}
pools:
  ok: {{members: [a]}}
  down: {{members: [dead]}}
  flaky: {{members: [c]}}
models:
  chat: {{pool: ok}}
  broken: {{pool: down}}
  flaky: {{pool: flaky}}
"""
    )


def post(gw, body: bytes | dict, path: str = "/chat/completions", **kw) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(gw.base_url + path, json=body, timeout=10, **kw)
    return httpx.post(
        gw.base_url + path,
        content=body,
        timeout=10,
        headers={"content-type": "application/json"},
        **kw,
    )


MSG = [{"role": "user", "content": "hi"}]


def test_malformed_json(gw) -> None:
    assert_error(post(gw, b'{"model": "chat", "messages": ['), 400, "invalid_json")
    assert_error(post(gw, b""), 400, "invalid_json")
    assert_error(post(gw, b"[1, 2]"), 400, "invalid_json")


def test_wrong_types(gw) -> None:
    e = assert_error(post(gw, {"model": "chat", "messages": "hi"}), 400, "invalid_type")
    assert e["param"] == "messages"
    e = assert_error(post(gw, {"model": 5, "messages": MSG}), 400, "invalid_type")
    assert e["param"] == "model"
    e = assert_error(post(gw, {"model": "chat", "messages": MSG, "stream": "yes"}), 400)
    assert e["param"] == "stream"
    e = assert_error(post(gw, {"model": "chat", "messages": MSG, "max_tokens": "10"}), 400)
    assert e["param"] == "max_tokens"
    e = assert_error(post(gw, {"model": "chat", "messages": [{"content": "no role"}]}), 400)
    assert e["param"] == "messages[0].role"


def test_missing_fields(gw) -> None:
    e = assert_error(post(gw, {"messages": MSG}), 400, "missing_required_parameter")
    assert e["param"] == "model"
    e = assert_error(post(gw, {"model": "chat"}), 400, "missing_required_parameter")
    assert e["param"] == "messages"
    e = assert_error(post(gw, {"model": "chat"}, "/completions"), 400, "missing_required_parameter")
    assert e["param"] == "prompt"
    e = assert_error(post(gw, {"model": "chat"}, "/embeddings"), 400, "missing_required_parameter")
    assert e["param"] == "input"


def test_unknown_model_404(gw) -> None:
    e = assert_error(post(gw, {"model": "gpt-nope", "messages": MSG}), 404, "model_not_found")
    assert e["param"] == "model"
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=MSG)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="chat", messages=[])


def test_unknown_url_and_method(gw) -> None:
    assert_error(httpx.get(gw.base_url + "/nothing-here"), 404)
    assert_error(httpx.get(gw.base_url + "/chat/completions"), 405)


def test_body_too_large_413(gw) -> None:
    big = {"model": "chat", "messages": [{"role": "user", "content": "x" * 10_000}]}
    assert_error(post(gw, big), 413, "request_too_large")


def test_upstream_down_502_without_leaks(gw) -> None:
    e = assert_error(post(gw, {"model": "broken", "messages": MSG}), 502, "upstream_unavailable")
    assert "127.0.0.1" not in e["message"] and ":9" not in e["message"]


def test_upstream_5xx_502(gw, fleet) -> None:
    fleet.set_faults("a", error_rate=1.0, error_status=[500])
    try:
        e = assert_error(post(gw, {"model": "chat", "messages": MSG}), 502, "upstream_error")
    finally:
        fleet.clear_faults("a")
    assert fleet.url("a") not in e["message"]


def test_upstream_rate_limited_503_with_retry_after(gw, fleet) -> None:
    fleet.set_faults("a", rate_limit=1.0, retry_after_s=7)
    try:
        r = post(gw, {"model": "chat", "messages": MSG})
    finally:
        fleet.clear_faults("a")
    assert_error(r, 503, "upstream_rate_limited")
    assert r.headers["retry-after"] == "7"


def test_upstream_timeout_504(gw, fleet) -> None:
    fleet.set_faults("c", hang=True)
    try:
        assert_error(post(gw, {"model": "flaky", "messages": MSG}), 504, "upstream_timeout")
        assert_error(
            post(gw, {"model": "flaky", "messages": MSG, "stream": True}), 504, "upstream_timeout"
        )
    finally:
        fleet.clear_faults("c")


def test_upstream_4xx_passes_through(gateway, capture_upstream) -> None:
    capture_upstream.status = 422
    gw = gateway(
        f"providers:\n  cap: {{base_url: '{capture_upstream.url}'}}\npools:\n  p: {{members: [cap]}}\n"
        "models:\n  chat: {pool: p}\n"
    )
    r = post(gw, {"model": "chat", "messages": MSG})
    assert r.status_code == 422
    assert r.json() == capture_upstream.error_body


def test_auth_401(fleet, gateway) -> None:
    key = "gw-test-key-123"
    gw = gateway(
        f"""
auth:
  keys:
    - {{tenant: team-a, key_sha256: {hashlib.sha256(key.encode()).hexdigest()}}}
providers:
  a: {{base_url: '{fleet.url("a")}'}}
pools:
  p: {{members: [a]}}
models:
  chat: {{pool: p}}
"""
    )
    assert_error(post(gw, {"model": "chat", "messages": MSG}), 401, "invalid_api_key")
    assert_error(
        post(gw, {"model": "chat", "messages": MSG}, headers={"authorization": "Bearer wrong"}), 401
    )
    assert_error(httpx.get(gw.base_url + "/models"), 401)
    ok = post(gw, {"model": "chat", "messages": MSG}, headers={"authorization": f"Bearer {key}"})
    assert ok.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="wrong", max_retries=0).chat.completions.create(
            model="chat", messages=MSG
        )


def test_provider_key_never_leaks(gw, fleet, caplog) -> None:
    """Responses, errors, streams and logs never contain the provider key."""
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    fleet.set_faults("a", error_rate=0.5, error_status=[500, 503])
    try:
        for i in range(6):
            for model in ("chat", "broken"):
                r = post(gw, {"model": model, "messages": MSG, "stream": bool(i % 2)})
                seen.append(r.text)
                seen.extend(f"{k}: {v}" for k, v in r.headers.items())
    finally:
        fleet.clear_faults("a")
    seen.append(caplog.text)
    blob = "\n".join(seen)
    assert SECRET not in blob
    assert hashlib.sha256(SECRET.encode()).hexdigest() not in blob
