"""A request class's name goes out in the `x-gateway-class` header and labels metrics: a name a
header cannot carry (non-Latin letters, spaces, line breaks, 10,000 characters) passed the check
and then every request of that class ended in a 500 with no access-log line. Class names are
held to the same shape as every other name in a policy, with their path and line."""

from __future__ import annotations

import httpx
import pytest

from gateway.policy.loader import check_policy
from tests.support import policy

TEMPLATE = """\
providers:
  a: {{base_url: "http://127.0.0.1:9/v1"}}
pools:
  p: {{members: [a]}}
classes:
  - {{name: ok, max_prompt_tokens: 10}}
  - {{name: {name}}}
models:
  m: {{pool: p}}
"""


@pytest.mark.parametrize(
    "name",
    ['"интерактив"', '"two words"', '"a\\nb"', '"tab\\there"', '"x' + "y" * 200 + '"', '"é"'],
)
def test_names_a_header_cannot_carry_are_refused(name: str) -> None:
    report = check_policy(TEMPLATE.format(name=name), "p.yaml", {})
    assert report.policy is None
    assert any(
        e.startswith("classes.1.name: must be") and e.endswith("(line 7)") for e in report.errors
    ), report.errors


@pytest.mark.parametrize("name", ["interactive", "long-ctx", "tier.1", "a:b/c@d+e_f"])
def test_ordinary_names_pass(name: str) -> None:
    report = check_policy(TEMPLATE.format(name=name), "p.yaml", {})
    assert report.errors == [], report.errors


def test_a_live_reload_to_it_is_refused_and_requests_keep_their_class(fleet, gateway) -> None:
    good = policy(fleet, "a", classes=[{"name": "short", "max_prompt_tokens": 100000}])
    gw = gateway(good)
    r = gw.chat()
    assert r.status_code == 200 and r.headers["x-gateway-class"] == "short"
    gw.policy_path.write_text(good.replace("name: short", "name: интерактив"))
    reload = httpx.post(gw.url + "/admin/reload", timeout=15)
    assert reload.status_code == 400 and "classes.0.name" in reload.text, reload.text
    r = gw.chat()
    assert r.status_code == 200 and r.headers["x-gateway-class"] == "short"
