"""An unexpected exception inside an attempt is that attempt's failure: retried on another
member, fed to the breaker and the balancer, recorded; never a 500."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import NO_BACKOFF, GatewayServer, policy

FLEET = ["a", "b"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def round_robin_ab(fleet: Fleet) -> str:
    return policy(fleet, "a", "b", pool={"balancer": {"strategy": "round_robin"}}, retry=NO_BACKOFF)


def boom(*_: Any, **__: Any) -> Any:
    raise RuntimeError("Session is closed")


def test_exception_in_an_attempt_is_retried_never_a_500(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    gw = gateway(round_robin_ab(fleet))
    a = gw.runtime.snapshot.providers["a"]
    a.client.send = boom
    a.client.open_stream = boom
    for stream in (False, True, False, True):
        r = gw.chat(stream=stream)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "b"
        if stream:
            assert r.text.rstrip().endswith("data: [DONE]")
    failed = [c for c in gw.seen if c.failures]
    assert failed and all(c.failures == ["a:attempt_error"] for c in failed)
    assert len(gw.seen) == 4  # each request recorded once
    assert a.member.failures == len(failed)
    assert a.member.failure_share() > 0
    assert a.breaker.snapshot()["window_failures"] == len(failed)


def test_exception_on_every_member_is_a_clean_502(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    gw = gateway(round_robin_ab(fleet))
    for p in gw.runtime.snapshot.providers.values():
        p.client.send = boom
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_error"
