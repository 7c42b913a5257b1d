"""A provider's (or its proxy's) 408 Request Timeout, 409 Conflict or 425 Too Early says it failed
for now, not that the request is wrong: the attempt is retried on another member, and alone it
is the gateway's own 502, never the provider's status relayed as the client's fault. A 400 is
still the client's (relayed, not retried).

Official `openai` client -> gateway -> a real loopback upstream answering with the status; the
openai (pass-through), anthropic and gemini adapters each classify it.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from aiohttp import web

from tests.support import GatewayServer, ThreadedUpstream, poll

MSG = [{"role": "user", "content": "hi"}]
OK = {
    "id": "c",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
STATUSES = [408, 409, 425]
TYPES = ["openai", "anthropic", "gemini"]


class Upstream(ThreadedUpstream):
    """`/<status>/...` answers that status in the wire format's error shape; `/ok/...` answers."""

    async def _handle(self, request: web.Request) -> web.Response:
        # Gemini's base_url is the API root: its status is the model id (`/v1beta/models/408:...`).
        status = request.match_info.get("status") or request.match_info["method"].split(":")[0]
        if status == "ok":
            return web.json_response(OK)
        err = {"error": {"message": "try again", "type": "timeout", "code": int(status)}}
        return web.json_response(err, status=int(status))

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{status}/v1/chat/completions", self._handle)
        app.router.add_post("/{status}/v1/messages", self._handle)
        app.router.add_post("/v1beta/models/{method}", self._handle)


def _policy(up: Upstream) -> str:
    root = f"http://127.0.0.1:{up.port}"
    lines = [
        "retry: {max_attempts: 3, base_backoff_ms: 1, max_backoff_ms: 2, budget_min_per_s: 1000}"
    ]
    lines += ["providers:", f"  good: {{base_url: '{root}/ok/v1'}}"]
    pools, models = ["pools:", "  p_good: {members: [good]}"], ["models:"]
    for kind in TYPES:
        for status in [*STATUSES, 400]:
            base = {"openai": f"{root}/{status}/v1", "anthropic": f"{root}/{status}"}.get(
                kind, root
            )
            model = f", models: {{'*': '{status}'}}" if kind == "gemini" else ""
            for name, fallback in (
                (f"{kind}{status}", ", fallback: [p_good]"),
                (f"{kind}{status}_solo", ""),
            ):
                lines.append(
                    f"  {name}: {{type: {kind}, base_url: '{base}'{model}, "
                    "breaker: {consecutive_failures: 1000}}"
                )
                pools.append(f"  p_{name}: {{members: [{name}], max_attempts: 1{fallback}}}")
                models.append(f"  {name}: {{pool: p_{name}}}")
    return "\n".join([*lines, *pools, *models]) + "\n"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Upstream() as up, GatewayServer(_policy(up)) as server:
        yield server


def _failures(gw: GatewayServer, alias: str) -> list[str]:
    ctx = poll(lambda: next((c for c in reversed(gw.seen) if c.alias == alias), None))
    return list(ctx.failures)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("status", STATUSES)
def test_a_transient_4xx_is_retried_on_another_member(
    gw: GatewayServer, kind: str, status: int
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    answer = client.chat.completions.create(model=f"{kind}{status}", messages=MSG)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "hi"
    assert _failures(gw, f"{kind}{status}") == [f"{kind}{status}:upstream_5xx"]


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("status", STATUSES)
def test_a_transient_4xx_alone_is_the_gateways_502(
    gw: GatewayServer, kind: str, status: int
) -> None:
    r = httpx.post(
        gw.base_url + "/chat/completions", json={"model": f"{kind}{status}_solo", "messages": MSG}
    )
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_error"


@pytest.mark.parametrize("kind", TYPES)
def test_a_400_is_still_the_clients_and_not_retried(gw: GatewayServer, kind: str) -> None:
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": f"{kind}400", "messages": MSG})
    assert r.status_code == 400, r.text
    assert _failures(gw, f"{kind}400") == [f"{kind}400:upstream_4xx"]
