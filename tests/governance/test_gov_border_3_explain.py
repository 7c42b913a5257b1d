"""Explain refuses an alias the caller's key may not use as the request itself is refused (the
same 404 as an alias that does not exist): other teams' routes are not shown. Real gateways on
loopback, the project's simulator, real Redis.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.support import GatewayServer


@pytest.fixture
def gw(two_alias_gw: GatewayServer) -> GatewayServer:
    return two_alias_gw


def test_explain_refuses_aliases_the_key_may_not_use(gw: GatewayServer) -> None:
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "t", "aliases": ["chat"]}).json()
    auth = {"authorization": f"Bearer {key['key']}"}
    body = {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/chat/completions", "/gateway/explain"):
        r = httpx.post(gw.base_url + path, json=body, headers=auth, timeout=10)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["code"] == "model_not_found"
        assert "secret-pool" not in r.text
    refused = [
        httpx.post(gw.base_url + p, json={**body, "model": m}, headers=auth, timeout=10).json()
        for p in ("/chat/completions", "/gateway/explain")
        for m in ("other", "no-such-alias")
    ]
    # Forbidden and unknown aliases read alike (the same answer, the alias's name aside).
    shapes = {str(e["error"] | {"message": ""}) for e in refused}
    assert len(shapes) == 1
    allowed = httpx.post(
        gw.base_url + "/gateway/explain", json={**body, "model": "chat"}, headers=auth, timeout=10
    )
    assert allowed.status_code == 200 and allowed.json()["pools"] == ["main"]
    # A key without an alias list (every alias) still sees every route.
    every = httpx.post(gw.url + "/admin/keys", json={"tenant": "t"}).json()
    r = httpx.post(
        gw.base_url + "/gateway/explain",
        json=body,
        headers={"authorization": f"Bearer {every['key']}"},
        timeout=10,
    )
    assert r.status_code == 200 and r.json()["pools"] == ["secret-pool"]


def test_count_tokens_refuses_aliases_the_key_may_not_use(gw: GatewayServer) -> None:
    """The Messages API's token count answers for allowed aliases only; another is refused as an
    alias that does not exist (the Anthropic SDK, as a client sends it)."""
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "t", "aliases": ["chat"]}).json()
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key["key"], max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    assert claude.messages.count_tokens(model="chat", messages=messages).input_tokens > 0
    refused = []
    for model in ("other", "no-such-alias"):
        with pytest.raises(anthropic.NotFoundError) as e:
            claude.messages.count_tokens(model=model, messages=messages)
        refused.append(str(e.value.body).replace(model, ""))
    assert refused[0] == refused[1]
