"""An alias a managed key may not use is refused before anything about the alias is looked at:
a request too long for that alias's context window got a 400 naming the window, which an alias
that does not exist never gets (so the key could tell which other aliases exist, and their
sizes). Real gateway on loopback, the project's simulator, real Redis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer


@pytest.fixture
def gw(fleet: Fleet, managed: Callable[[str], GatewayServer]) -> GatewayServer:
    return managed(
        f"""
providers:
  p: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main}}
  small: {{pool: main, context_window: 64}}
"""
    )


@pytest.mark.parametrize("path", ["/chat/completions", "/gateway/explain"])
def test_a_forbidden_alias_reads_as_an_unknown_one_whatever_the_request(
    gw: GatewayServer, path: str
) -> None:
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "t", "aliases": ["chat"]}).json()
    auth = {"authorization": f"Bearer {key['key']}"}
    long: Any = [{"role": "user", "content": "word " * 400}]
    answers = {}
    for model in ("small", "no-such-alias"):
        r = httpx.post(
            gw.base_url + path,
            json={"model": model, "messages": long, "max_tokens": 10_000},
            headers=auth,
            timeout=10,
        )
        answers[model] = (r.status_code, r.json()["error"]["code"])
    assert answers["small"] == answers["no-such-alias"] == (404, "model_not_found")
    # A key that may use it is told about the window.
    every = httpx.post(gw.url + "/admin/keys", json={"tenant": "t"}).json()
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "small", "messages": long},
        headers={"authorization": f"Bearer {every['key']}"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
