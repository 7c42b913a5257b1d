"""`${...}` that is not a variable reference the policy understands (`${VAR}`, `${VAR:-default}`)
is refused with its path and line: an unclosed one, a nested default (`${A:-${B}}`) or a shell
form (`${A-x}`, `${A:=x}`) was kept as literal text, and a model id or header value such as
"${B}" or "Bearer ${KEY-}" was sent upstream on every request. Values that came from the
environment are never parsed again (a variable may hold "${" itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy.loader import check_policy

TEMPLATE = """\
providers:
  a:
    base_url: "http://127.0.0.1:9/v1"
    models: {m: "MODEL"}
    headers: {Authorization: "HEADER"}
pools:
  p: {members: [a]}
models:
  m: {pool: p}
"""


def text(model: str = "gpt-4o", header: str = "Bearer ${KEY}") -> str:
    return TEMPLATE.replace("MODEL", model).replace("HEADER", header)


ENV = {"KEY": "k-123", "B": "bee", "TRICKY": "${NOT_A_REF} and ${"}


@pytest.mark.parametrize(
    "value",
    ["${A:-${B}}", "${A:-x${B}}y", "${A", "x ${A", "${A-x}", "${A:=x}", "${1A}", "${}", "${ A }"],
)
def test_what_is_not_a_reference_is_refused_with_path_and_line(value: str) -> None:
    report = check_policy(text(model=value), "p.yaml", ENV)
    assert report.policy is None
    assert report.errors == [
        "providers.a.models.m: holds a '${' that is not a variable reference: write ${VAR} "
        "or ${VAR:-default} (no nesting) (line 4)"
    ]
    report = check_policy(text(header=f"Bearer {value}"), "p.yaml", ENV)
    assert report.policy is None
    assert report.errors[0].startswith("providers.a.headers.Authorization: holds a '${'")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("${B}", "bee"),
        ("pre-${B}-${A:-x}-post", "pre-bee-x-post"),
        ("${A:-}", ""),
        ("$B", "$B"),
        ("$${B}", "$bee"),
        ("a}b{c$", "a}b{c$"),
        ("${TRICKY}", "${NOT_A_REF} and ${"),  # a value is inserted, never parsed again
    ],
)
def test_references_and_plain_text_still_work(value: str, expected: str) -> None:
    report = check_policy(text(model=value), "p.yaml", ENV)
    assert report.errors == [], report.errors
    assert report.policy is not None
    assert report.policy.providers["a"].models["m"] == expected


def test_policy_check_names_it(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text(header="Bearer ${KEY-}"))
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "providers.a.headers.Authorization: holds a '${'" in res.stderr
