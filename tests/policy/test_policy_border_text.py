"""Text in a policy or rules file must be encodable: a YAML escape like "\\ud800" (a lone UTF-16
surrogate) or an environment variable holding bytes that are not UTF-8 gave strings no encoder
accepts, and then every /v1/models (an alias's owned_by), every upstream request (a model
mapping, a header) or every degraded answer (a template) failed. They are refused with their path
and line; real non-ASCII text passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.policy.loader import check_policy, check_policy_file
from tests.support import policy

TEMPLATE = """\
providers:
  a:
    base_url: "http://127.0.0.1:9/v1"
    models: {m: "MODEL"}
    headers: {X-Team: "HEADER"}
pools:
  p: {members: [a]}
models:
  m: {pool: p, owned_by: "OWNER"}
"""
SANE = {"MODEL": "gpt-4o", "HEADER": "team", "OWNER": "llm-gateway"}


def text(**values: str) -> str:
    out = TEMPLATE
    for k, v in {**SANE, **values}.items():
        out = out.replace(k, v)
    return out


@pytest.mark.parametrize(
    "field, path, line",
    [
        ("MODEL", "providers.a.models.m", 4),
        ("HEADER", "providers.a.headers.X-Team", 5),
        ("OWNER", "models.m.owned_by", 9),
    ],
)
@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "x\\udc80y", "\\ud83d"])
def test_lone_surrogates_are_refused_with_path_and_line(
    field: str, path: str, line: int, escape: str
) -> None:
    report = check_policy(text(**{field: escape}), "p.yaml", {})
    assert report.policy is None
    assert len(report.errors) == 1, report.errors
    assert f"{path}: \\ud" in report.errors[0] and f"(line {line})" in report.errors[0]
    assert report.errors[0].encode("utf-8")  # the report itself is printable text


def test_a_surrogate_in_a_key_is_refused() -> None:
    report = check_policy(text() + '  "m\\ud800": {pool: p}\n', "p.yaml", {})
    assert report.policy is None and "is not a character (line 10)" in report.errors[0]


def test_real_non_ascii_text_passes() -> None:
    report = check_policy(
        text(OWNER="équipe ☃ \\U0001F600 😀", HEADER="d\\u00e9j\\u00e0"), "p.yaml", {}
    )
    assert report.errors == [], report.errors
    assert report.policy is not None
    assert report.policy.models["m"].owned_by == "équipe ☃ 😀 😀"


def test_an_environment_variable_that_is_not_utf8_is_named_not_shown() -> None:
    value = os.fsdecode(b"tok\xffen")  # how Python reads such bytes from the environment
    report = check_policy(text(HEADER="${TEAM}"), "p.yaml", {"TEAM": value})
    assert report.policy is None
    assert report.errors == [
        "providers.a.headers.X-Team: environment variable TEAM is not UTF-8 text (line 5)"
    ]


def test_rules_templates_are_checked_too(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(
        'rules:\n  - name: r\n    template: "Busy \\udc00"\n'
    )
    path = tmp_path / "policy.yaml"
    path.write_text(text() + "degradation: {rules: rules}\n")
    report = check_policy_file(path, env={})
    assert report.policy is None
    assert "\\udc00 is not a character (line 3)" in " ".join(report.errors)


def test_policy_check_and_a_live_reload_refuse_it(tmp_path: Path, fleet, gateway) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text(OWNER="\\ud800"))
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "models.m.owned_by: \\ud800 is not a character" in res.stderr

    good = policy(fleet, "a", alias={"owned_by": "team"})
    gw = gateway(good)
    gw.policy_path.write_text(good.replace("owned_by: team", 'owned_by: "\\ud800"'))
    r = httpx.post(gw.url + "/admin/reload", timeout=15)
    assert r.status_code == 400 and "models.chat.owned_by" in r.text, r.text
    models = httpx.get(gw.base_url + "/models", timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["owned_by"] == "team"
    assert gw.chat().status_code == 200
