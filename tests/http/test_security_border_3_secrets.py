"""A provider key quoted base64-encoded in an upstream error (or a whole answer) never reaches
a client or a log.

Live: official clients -> gateway -> a loopback upstream whose 400 quotes the credentials it
received, base64-encoded the ways providers and their proxies write them (the key alone, an
echoed `Basic user:key`, the key at each alignment in a 3-byte group, the URL-safe alphabet,
without padding). The keys are short (as a self-hosted server's `--api-key` often is): their
encodings are under the 32 characters that the generic "long opaque token" rule masks.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from aiohttp import web

from tests.support import AccessLines, GatewayServer, ThreadedUpstream, completion_body, policy

KEY = "vllm-k3y-short9"  # api_key_env
HEADER_SECRET = "hdr-Secret-77"  # a credential header of the policy
MSG = [{"role": "user", "content": "hi"}]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


# How an upstream quotes a credential it received, by the alias asked for (the upstream sees the
# mapped model id, the alias's name).
FORMS: dict[str, Any] = {
    "alone": lambda k: f"got {_b64(k.encode())} instead",
    "basic": lambda k: f"credentials {_b64(b'user:' + k.encode())} refused",
    "shift1": lambda k: f"sig {_b64(b'x' + k.encode())} bad",
    "shift2": lambda k: f"sig {_b64(b'xy' + k.encode() + b'!')} bad",
    "urlsafe": lambda k: f"token={_b64url(b'~~' + k.encode() + b'??')}",
    "nopad": lambda k: f"unexpected ({_b64(k.encode()).rstrip('=')}).",
}


class EchoingUpstream(ThreadedUpstream):
    """Answers every chat request with a 400 quoting its credentials in one encoding."""

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer = body["model"].startswith("ok-")
        form = FORMS[body["model"].removeprefix("ok-")]
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        extra = request.headers.get("x-extra-auth", "")
        message = f"{form(key)}; header {form(extra)}"
        if answer:  # a 200 whose text quotes the credentials (a debugging proxy, an echo)
            return web.json_response(completion_body(message))
        err = {"error": {"message": message, "type": "invalid_request_error"}}
        return web.json_response(err, status=400)


def _encodings(secret: str) -> set[str]:
    """Every base64 spelling of `secret`'s characters: 8-character runs of each alignment's
    encoding that depend on the secret's bytes alone."""
    out = set()
    raw = secret.encode()
    for k in range(3):
        for enc in (_b64(b"\0" * k + raw), _b64url(b"\0" * k + raw)):
            core = enc[(8 * k + 5) // 6 : (8 * (k + len(raw))) // 6]
            out |= {core[i : i + 8] for i in range(len(core) - 7)}
    return out


LEAKS = _encodings(KEY) | _encodings(HEADER_SECRET) | {KEY, HEADER_SECRET}


def _leaks(text: str) -> list[str]:
    return sorted(s for s in LEAKS if s in text)


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with EchoingUpstream() as up, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLM_KEY_SHORT", KEY)
        mp.setenv("LLM_KEY_HDR", HEADER_SECRET)
        doc = policy(
            {"up": f"http://127.0.0.1:{up.port}/v1"},
            provider={
                "api_key_env": "LLM_KEY_SHORT",
                "headers": {"X-Extra-Auth": "${LLM_KEY_HDR}"},
            },
            models={
                **{form: {"pool": "main"} for form in FORMS},
                **{f"ok-{form}": {"pool": "main"} for form in FORMS},
            },
        )
        with GatewayServer(doc) as server:
            yield server


def test_the_leak_detector_sees_the_raw_upstream_message() -> None:
    # Without the gateway in between each form shows the secrets (the test can fail).
    for form in FORMS.values():
        assert _leaks(form(KEY)) and _leaks(form(HEADER_SECRET))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_base64_encoded_key_in_an_upstream_error_never_reaches_the_client(
    gw: GatewayServer, form: str
) -> None:
    access = AccessLines()
    logger = logging.getLogger("gateway.access")
    logger.addHandler(access)
    try:
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": form, "messages": MSG})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"], r.text  # the words around the key stay
        assert not _leaks(r.text), r.text
        assert not _leaks(json.dumps(dict(r.headers)))
        line = access.wait_for(r.headers["x-request-id"])
        assert not _leaks(json.dumps(line))
    finally:
        logger.removeHandler(access)
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=form, messages=MSG)  # type: ignore[arg-type]
    assert not _leaks(json.dumps(e.value.body)), e.value.body
    # The same through the Messages API, in Anthropic's error shape.
    ac = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ae:
        ac.messages.create(model=form, max_tokens=5, messages=MSG)  # type: ignore[arg-type]
    assert isinstance(ae.value.body, dict) and ae.value.body.get("type") == "error"
    assert not _leaks(json.dumps(ae.value.body)), ae.value.body


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_base64_encoded_key_in_an_upstream_answer_never_reaches_the_client(
    gw: GatewayServer, form: str
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    out = client.chat.completions.create(model=f"ok-{form}", messages=MSG)  # type: ignore[arg-type]
    text = out.choices[0].message.content or ""
    assert "header" in text  # the answer is relayed, its credentials masked
    assert not _leaks(text), text
