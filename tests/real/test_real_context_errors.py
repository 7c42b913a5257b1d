"""A provider's own context-overflow error reaches the client as OpenAI's context_length_exceeded.

The gateway's token estimate can under-count (the provider uses its own tokenizer: llama.cpp's
SmolLM2 vocabulary counts Chinese at about twice cl100k), so the provider may be the one to
refuse. Its body is rewritten to the shape OpenAI SDKs and clients already handle.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support import validate

MSG = [{"role": "user", "content": "hi"}]

LLAMA_CPP = {
    "error": {
        "code": 400,
        "type": "exceed_context_size_error",
        "message": "request (5011 tokens) exceeds the available context size (2048 tokens), "
        "try increasing it",
        "n_prompt_tokens": 5011,
        "n_ctx": 2048,
    }
}
# vLLM's older shape: not wrapped in "error", the limit only in the message.
VLLM = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens. However, you requested "
    "5000 tokens (4900 in the messages, 100 in the completion). Please reduce the length of the "
    "messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


def _policy(url: str) -> str:
    return f"providers:\n  cap: {{base_url: '{url}'}}\npools:\n  p: {{members: [cap]}}\nmodels:\n  chat: {{pool: p}}\n"


def _check(r: httpx.Response, limit: int, prompt: int | None) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    validate("ErrorResponse", body)
    err = body["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == "messages" and err["code"] == "context_length_exceeded"
    assert f"maximum context length is {limit} tokens" in err["message"]
    if prompt is not None:
        assert f"{prompt} tokens" in err["message"]


@pytest.mark.parametrize(
    ("upstream", "limit", "prompt"), [(LLAMA_CPP, 2048, 5011), (VLLM, 4096, None)]
)
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_overflow_becomes_context_length_exceeded(
    gateway, capture_upstream, upstream: dict, limit: int, prompt: int | None, stream: bool
) -> None:
    capture_upstream.status, capture_upstream.error_body = 400, upstream
    gw = gateway(_policy(capture_upstream.url))
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "chat", "messages": MSG, "stream": stream},
        timeout=10,
    )
    _check(r, limit, prompt)
    assert r.headers["x-gateway-provider"] == "cap"  # the provider refused, not the estimate


def test_sdk_raises_bad_request_with_the_code(gateway, capture_upstream) -> None:
    capture_upstream.status, capture_upstream.error_body = 400, LLAMA_CPP
    gw = gateway(_policy(capture_upstream.url))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="chat", messages=MSG)  # type: ignore[arg-type]
    assert exc.value.code == "context_length_exceeded" and exc.value.param == "messages"


def test_other_client_errors_pass_through_unchanged(gateway, capture_upstream) -> None:
    other = {
        "error": {
            "message": "temperature must be at most 2",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    capture_upstream.status, capture_upstream.error_body = 400, other
    gw = gateway(_policy(capture_upstream.url))
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": MSG})
    assert r.status_code == 400 and r.json() == other
