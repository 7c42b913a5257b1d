"""Integers in a policy are bounded like floats: past 1e12 no count, size or limit is usable, and
past 64 bits one cannot even be written as JSON (the admin views and explain answered 500). An
integer too long for Python to read (over 4300 digits, a ValueError out of the YAML loader) or
for float() (OverflowError) is refused with its path and line, never an exception."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.policy.crosscheck import MAX_NUMBER
from gateway.policy.loader import check_policy, check_policy_file
from tests.support import policy

TEMPLATE = """\
providers:
  a:
    base_url: "http://127.0.0.1:9/v1"
    max_inflight: {a}
pools:
  p:
    members: [a]
    queue: {{max_depth: {b}}}
models:
  m:
    pool: p
    default_max_tokens: {c}
server:
  max_connections: {d}
"""

FIELDS = {
    "a": ("providers.a.max_inflight", 4),
    "b": ("pools.p.queue.max_depth", 8),
    "c": ("models.m.default_max_tokens", 12),
    "d": ("server.max_connections", 14),
}
SANE = {"a": 8, "b": 16, "c": 256, "d": 4096}


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize(
    "value",
    [10**12 + 1, 2**63, 10**20, 10**99, -(10**20)],
    ids=["1e12+1", "2**63", "1e20", "1e99", "-1e20"],
)
def test_integers_past_the_bound_are_refused_with_path_and_line(field: str, value: int) -> None:
    path, line = FIELDS[field]
    report = check_policy(TEMPLATE.format(**{**SANE, field: value}), "p.yaml", {})
    assert report.policy is None
    mine = [e for e in report.errors if e.startswith(path + ": ")]
    assert mine and mine[0].endswith(f"(line {line})"), report.errors
    if value > 0:
        assert f"larger than {MAX_NUMBER:g}" in mine[0]


@pytest.mark.parametrize("digits", [101, 400, 4301, 20_000])
def test_an_integer_too_long_to_read_is_refused_not_raised(digits: int) -> None:
    value = "7" * digits
    report = check_policy(TEMPLATE.format(**{**SANE, "b": value}), "p.yaml", {})
    assert report.policy is None
    assert len(report.errors) == 1
    assert (
        "pools.p.queue.max_depth: an integer of more than 100 digits (line 8)" in (report.errors[0])
    )
    # As a key too (explicit YAML key: no length limit on it).
    keyed = TEMPLATE.format(**SANE) + f"? {value}\n: x\n"
    report = check_policy(keyed, "p.yaml", {})
    assert report.policy is None and "an integer of more than 100 digits" in report.errors[0]


def test_the_bound_itself_and_ordinary_integers_pass() -> None:
    report = check_policy(TEMPLATE.format(**{**SANE, "c": 10**12}), "p.yaml", {})
    assert report.errors == [], report.errors
    report = check_policy(TEMPLATE.format(**{**SANE, "b": "0x" + "f" * 8}), "p.yaml", {})
    assert report.errors == [], report.errors


def test_rules_files_refuse_them_too(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(
        f"rules:\n  - name: r\n    retry_after_s: {'9' * 5000}\n    template: x\n"
    )
    path = tmp_path / "policy.yaml"
    path.write_text(TEMPLATE.format(**SANE) + "degradation: {rules: rules}\n")
    report = check_policy_file(path, env={})
    assert report.policy is None
    assert "an integer of more than 100 digits (line 3)" in " ".join(report.errors)


def test_policy_check_lists_it_rather_than_failing(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(TEMPLATE.format(**{**SANE, "a": "1" * 5000}))
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "providers.a.max_inflight: an integer of more than 100 digits (line 4)" in res.stderr
    assert "cannot be checked" not in res.stderr and "Traceback" not in res.stderr


def test_a_live_gateway_refuses_the_reload_and_its_views_still_answer(fleet, gateway) -> None:
    good = policy(fleet, "a", provider={"max_inflight": 10**12})
    gw = gateway(good)
    for path in ("/admin/policy?full=true", "/admin/members"):
        assert httpx.get(gw.url + path, timeout=10).status_code == 200, path
    gw.policy_path.write_text(good.replace(str(10**12), str(10**20)))
    r = httpx.post(gw.url + "/admin/reload", timeout=15)
    assert r.status_code == 400 and "providers.a.max_inflight" in r.text, r.text
    for path in ("/admin/policy?full=true", "/admin/members"):
        assert httpx.get(gw.url + path, timeout=10).status_code == 200, path
    assert gw.chat().status_code == 200
