"""A member whose type cannot express a request (an Anthropic member for embeddings, n > 1,
logprobs) is skipped without sending anything; when it comes after a member that could serve the
request and failed, the client is told about that failure (502/503/504, retryable), never a 400
"no provider can serve this" that depends on the order the members were tried in (real
simulators on loopback, the official OpenAI client)."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll

FLEET = ["oa", "an"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def policy(fleet: Fleet, order: str) -> str:
    return f"""
providers:
  oa: {{base_url: '{fleet.url("oa")}', breaker: {{consecutive_failures: 0}}}}
  an: {{type: anthropic, base_url: '{fleet.root_url("an")}'}}
pools:
  main: {{members: [{order}], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
"""


def ask(client: openai.OpenAI, what: str) -> object:
    if what == "embeddings":
        return client.embeddings.create(model="chat", input="hello")
    if what == "n2":
        return client.chat.completions.create(
            model="chat", n=2, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    return client.chat.completions.create(
        model="chat", logprobs=True, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )


@pytest.mark.parametrize("what", ["embeddings", "n2", "logprobs"])
@pytest.mark.parametrize("order", ["oa, an", "an, oa"])
@pytest.mark.parametrize(
    ("fault", "status", "error_class"),
    [
        ({"error_rate": 1.0, "error_status": [503]}, 502, openai.InternalServerError),
        ({"rate_limit": 1.0, "retry_after_s": 3}, 503, openai.InternalServerError),
    ],
)
def test_the_capable_member_failure_is_what_the_client_reads(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
    what: str,
    order: str,
    fault: dict[str, object],
    status: int,
    error_class: type[openai.APIStatusError],
) -> None:
    fleet.set_faults("oa", **fault)
    gw = gateway(policy(fleet, order))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    with pytest.raises(error_class) as raised:
        ask(client, what)
    assert raised.value.status_code == status
    body = raised.value.response.json()["error"]
    assert body["type"] == "upstream_error" and body["code"] != "unsupported_endpoint"
    if status == 503:
        assert raised.value.response.headers["retry-after"] == "3"
    poll(lambda: gw.seen)  # recorded just after the answer was sent
    failures = sorted(gw.seen[-1].failures)
    assert failures[0] == "an:unsupported" and failures[1].startswith("oa:")


@pytest.mark.parametrize("what", ["embeddings", "n2"])
def test_only_unsupported_members_is_still_a_clear_400(
    fleet: Fleet, gateway: Callable[..., GatewayServer], what: str
) -> None:
    gw = gateway(policy(fleet, "an"))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client, what)
    assert raised.value.response.json()["error"]["code"] == "unsupported_endpoint"
