"""A reload applies every setting of the new version to the members that remain: their latency
estimates, in-flight counts and breakers survive, and follow the new parameters (the estimate's
time constant, the penalty of an unmeasured member and the fading of failures applied only to
members added by the reload)."""

from __future__ import annotations

import httpx
import pytest

from gateway.policy.loader import parse_policy
from gateway.runtime import Runtime


def text(decay_s: float, penalty_ms: float, failure_decay_s: float) -> str:
    return f"""
providers:
  a: {{base_url: "http://127.0.0.1:9/v1", max_inflight: 8}}
  b: {{base_url: "http://127.0.0.1:9/v1"}}
pools:
  main:
    members: [a, b]
    balancer: {{decay_s: {decay_s}, penalty_ms: {penalty_ms}, failure_decay_s: {failure_decay_s}}}
models:
  chat: {{pool: main}}
"""


def settings_of(runtime: Runtime, name: str) -> tuple[float, float, float]:
    m = runtime.snapshot.providers[name].member
    return (m.ewma._tau, m.ewma.penalty_s, m.failure_decay_s)


async def test_remaining_members_follow_the_new_balancer_settings() -> None:
    runtime = Runtime(parse_policy(text(10, 60000, 2), env={}))
    try:
        member = runtime.snapshot.providers["a"].member
        member.ewma.observe(0.5)
        member.inflight = 3
        assert settings_of(runtime, "a") == (10, 60.0, 2)
        runtime.apply(parse_policy(text(1.5, 250, 0.5), env={}))
        assert runtime.snapshot.providers["a"].member is member  # the same member...
        assert member.ewma.has_history and member.inflight == 3  # ...with what it measured
        assert member.ewma.estimate() == pytest.approx(0.5, rel=0.2)
        for name in ("a", "b"):
            assert settings_of(runtime, name) == (1.5, 0.25, 0.5), name
        # A member moved to another pool takes the settings of the pool that now holds it first.
        moved = text(1.5, 250, 0.5).replace("members: [a, b]", "members: [a]")
        moved = moved.replace(
            "models:",
            "  other: {members: [b], balancer: {decay_s: 4, penalty_ms: 9000}}\nmodels:",
        )
        runtime.apply(parse_policy(moved, env={}))
        assert settings_of(runtime, "b") == (4, 9.0, 2.0)
        assert settings_of(runtime, "a") == (1.5, 0.25, 0.5)
    finally:
        await runtime.aclose()


def test_a_live_reload_applies_them(gateway) -> None:
    gw = gateway(text(10, 60000, 2))
    before = gw.runtime.snapshot.providers["a"].member
    gw.policy_path.write_text(text(3, 1500, 1))
    r = httpx.post(gw.url + "/admin/reload", timeout=15)
    assert r.status_code == 200, r.text
    assert gw.runtime.snapshot.providers["a"].member is before
    assert settings_of(gw.runtime, "a") == (3, 1.5, 1)
