"""The client's cache headers through the HTTP API, with the simulator and a real Redis.

`x-gateway-cache-namespace` keys both caches, so a value the gateway cannot key on faithfully
(too long, not printable ASCII) is a 400 in the API's own shape, never quietly the shared default
namespace. `Cache-Control` directives are matched whole and case-insensitively: `max-age=0` and,
without Cache-Control, `Pragma: no-cache` refresh like `no-cache`. Each request, whatever the
outcome, gets one access-log line and one metrics observation.
"""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest

from tests.support import TWO_TENANTS, AccessLines, policy, requests_at

MSG = [{"role": "user", "content": "Which headers does the cache read?"}]
NS = "x-gateway-cache-namespace"


@pytest.fixture
def gw(fleet, gateway, redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    fleet.reset("a")
    return gateway(policy({"p": fleet.url("a")}, auth=TWO_TENANTS), redis_url=redis_url)


def post(gw, headers: dict[str, str | bytes] | None = None, **kw) -> httpx.Response:
    body = {"model": "chat", "messages": MSG, "temperature": 0, "max_tokens": 8, **kw}
    return httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": "Bearer key-1", **(headers or {})},
        timeout=30,
    )


def recorded(gw, n: int) -> list:
    deadline = time.monotonic() + 3
    while len(gw.seen) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # nothing more arrives
    return gw.seen


@pytest.mark.parametrize(
    "value",
    [
        "n" * 257,
        "n" * 10_000,
        "caf\u00e9".encode(),  # UTF-8 bytes on the wire
        "tab\there",
        "\u00e9t\u00e9".encode("latin-1"),
    ],
    ids=["257", "10k", "utf8", "tab", "latin1"],
)
def test_a_namespace_it_cannot_key_on_is_a_400_with_one_record(gw, fleet, value) -> None:
    r = post(gw, {NS: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == NS and err["code"] == "invalid_cache_namespace"
    assert requests_at(fleet, "a") == 0
    seen = recorded(gw, 1)
    assert [c.status for c in seen] == [400]
    # And it did not land in the default namespace either.
    assert post(gw).headers["x-gateway-cache"] == "miss"


def test_a_namespace_up_to_256_printable_characters_keys_the_cache(gw, fleet) -> None:
    longest = "ns " + "~" * 253
    assert post(gw, {NS: longest}).headers["x-gateway-cache"] == "miss"
    assert post(gw, {NS: longest}).headers["x-gateway-cache"] == "hit-exact"
    assert post(gw, {NS: longest[:-1]}).headers["x-gateway-cache"] == "miss"
    assert post(gw).headers["x-gateway-cache"] == "miss"
    assert post(gw, {NS: ""}).headers["x-gateway-cache"] == "hit-exact"  # empty: no namespace
    assert requests_at(fleet, "a") == 3


def test_a_ttl_of_zero_stores_nothing_in_the_exact_cache(gw, fleet) -> None:
    ttl0 = {"x-gateway-cache-ttl": "0"}
    assert post(gw, ttl0).headers["x-gateway-cache"] == "miss"
    assert post(gw, ttl0).headers["x-gateway-cache"] == "miss"
    assert post(gw).headers["x-gateway-cache"] == "miss"  # nothing was stored
    assert post(gw, ttl0).headers["x-gateway-cache"] == "hit-exact"  # it still reads
    assert requests_at(fleet, "a") == 3


def test_the_other_apis_refuse_a_bad_namespace_in_their_own_shape(gw, fleet) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key="key-1", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="chat",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={NS: "n" * 300},
        )
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    oai = openai.OpenAI(base_url=gw.base_url, api_key="key-1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad_resp:
        oai.responses.create(model="chat", input="hi", extra_headers={NS: "n" * 300})
    assert bad_resp.value.code == "invalid_cache_namespace"
    assert requests_at(fleet, "a") == 0
    assert sorted(c.status for c in recorded(gw, 2)) == [400, 400]


@pytest.mark.parametrize(
    ("headers", "served"),
    [
        ({"cache-control": "max-age=0"}, "miss"),
        ({"cache-control": "private, MAX-AGE=0"}, "miss"),
        ({"cache-control": 'max-age="0"'}, "miss"),
        ({"pragma": "no-cache"}, "miss"),
        ({"cache-control": "No-Cache"}, "miss"),
        ({"cache-control": "max-age=60"}, "hit-exact"),
        ({"cache-control": "max-age=60", "pragma": "no-cache"}, "hit-exact"),
        ({"cache-control": "x-no-store-hint, x-no-cache-hint"}, "hit-exact"),
        ({"cache-control": "NO-STORE"}, "bypass"),
    ],
)
def test_cache_control_directives(gw, fleet, headers, served) -> None:
    first = post(gw)
    assert first.headers["x-gateway-cache"] == "miss"
    r = post(gw, headers)
    assert r.status_code == 200 and r.headers["x-gateway-cache"] == served
    assert requests_at(fleet, "a") == (1 if served == "hit-exact" else 2)
    if served == "miss":  # a refresh: the fresh answer replaced the entry
        again = post(gw)
        assert again.headers["x-gateway-cache"] == "hit-exact"
        assert again.json()["id"] == r.json()["id"] != first.json()["id"]


def test_each_outcome_has_one_access_log_line(gw, access_log: AccessLines) -> None:
    outcomes = []
    for headers in (
        {},
        {},
        {"cache-control": "no-store"},
        {"cache-control": "max-age=0"},
        {NS: "a\tb"},
    ):
        r = post(gw, headers)
        outcomes.append(
            (r.headers["x-request-id"], r.status_code, r.headers.get("x-gateway-cache"))
        )
    for request_id, status, _ in outcomes:
        access_log.wait_for(request_id, status=status)
    time.sleep(0.1)
    ids = [line["request_id"] for line in access_log.lines]
    assert all(ids.count(rid) == 1 for rid, _, _ in outcomes)
    assert [(s, c) for _, s, c in outcomes][:4] == [
        (200, "miss"), (200, "hit-exact"), (200, "bypass"), (200, "miss"),
    ]  # fmt: skip
    assert outcomes[4][1] == 400
    assert len(gw.seen) == len(outcomes)
