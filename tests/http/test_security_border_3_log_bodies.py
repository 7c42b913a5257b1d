"""A key a client sends in its request body never reaches the access log (GATEWAY_LOG_BODIES=1).

Client libraries and proxies put their settings in the body (`api_key`, `extra_headers` holding
an Authorization, `base_url` with credentials...). The gateway drops them before forwarding,
but the access log with bodies on wrote the client's body as it came, keys included. Live: the
official `openai` client and raw bodies (valid, with escaped member names, invalid JSON) through
a gateway over the project's simulator, the log read as an operator reads it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from loadtests.simulator.testing import run_fleet
from tests.support import AccessLines, GatewayServer, policy

SECRETS = ["sk-body-key-0123456789", "sk-header-key-987654", "hunter2-password", "q-token-555"]
MSG = [{"role": "user", "content": "the prompt stays readable"}]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with (
        run_fleet([{"name": "a", "profile": "fast"}]) as fleet,
        GatewayServer(policy(fleet), env={"GATEWAY_LOG_BODIES": "1"}) as server,
    ):
        yield server


@pytest.fixture()
def access() -> Iterator[AccessLines]:
    lines = AccessLines()
    logger = logging.getLogger("gateway.access")
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)


def _leaks(line: dict[str, Any]) -> list[str]:
    text = json.dumps(line)
    return [s for s in SECRETS if s in text]


def test_sdk_settings_in_the_body_are_masked_in_the_logged_body(
    gw: GatewayServer, access: AccessLines
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="chat",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=4,
        extra_body={
            "api_key": SECRETS[0],
            "extra_headers": {"Authorization": f"Bearer {SECRETS[1]}"},
            "base_url": f"https://user:{SECRETS[2]}@example.invalid/v1",
            "extra_query": {"token": SECRETS[3]},
        },
    )
    assert raw.status_code == 200
    line = access.wait_for(raw.headers["x-request-id"])
    assert line["request_body"] and "the prompt stays readable" in line["request_body"]
    assert not _leaks(line), line["request_body"]


# Bodies that hide the member names or are not JSON at all (answered with a 400, still logged).
RAW: dict[str, bytes] = {
    "escaped-name": b'{"model":"chat","messages":[{"role":"user","content":"hi"}],'
    b'"api\\u005fkey":"' + SECRETS[0].encode() + b'"}',
    "invalid-json": b'{"model":"chat","api_key" : "' + SECRETS[0].encode() + b'", '
    b'"extra_headers": {"Authorization": "Bearer ' + SECRETS[1].encode() + b'"}, "cut',
    "escaped-quote": b'{"api_key":"' + SECRETS[2].encode() + b'\\"x", "model": NaN}',
    "bare-value": b'{"extra_query": ' + json.dumps([SECRETS[3]]).encode() + b", oops}",
}


@pytest.mark.parametrize("name", sorted(RAW))
def test_hidden_or_unparsable_bodies_are_masked_too(
    gw: GatewayServer, access: AccessLines, name: str
) -> None:
    r = httpx.post(
        gw.base_url + "/chat/completions",
        content=RAW[name],
        headers={"content-type": "application/json"},
    )
    line = access.wait_for(r.headers["x-request-id"])
    assert line["request_body"]
    assert not _leaks(line), line["request_body"]
