"""Policy and degradation-rules files at the border of YAML: nesting deeper than Python's stack,
text that is not UTF-8, keys given twice. Each is refused with the file, the field path and the
line, by `gateway policy check`, `gateway serve` and the loaders, never with a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy.loader import check_policy, check_policy_file
from gateway.policy.rules import RuleFileError, load_file, load_rules
from gateway.policy.source import load_yaml

MINIMAL = """\
providers:
  a: {base_url: "http://127.0.0.1:1/v1"}
pools:
  p: {members: [a]}
models:
  chat: {pool: p}
"""


def deep(levels: int) -> str:
    return "a: " + "[" * levels + "]" * levels + "\n"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("levels", [101, 1000, 5000])
def test_deep_nesting_is_refused_not_a_recursion_error(levels: int) -> None:
    report = check_policy(deep(levels), "deep.yaml")
    assert report.policy is None
    assert report.errors == ["deep.yaml: refused: nested more than 100 levels (line 1)"]


def test_deep_nesting_on_a_later_line_names_that_line() -> None:
    report = check_policy(MINIMAL + "x:\n  y: " + "{k: " * 200 + "1" + "}" * 200 + "\n")
    assert report.errors == ["<string>: refused: nested more than 100 levels (line 8)"]


def test_nesting_within_the_bound_still_loads() -> None:
    data, _ = load_yaml(deep(99))
    assert isinstance(data["a"], list)


def test_cli_check_and_serve_refuse_a_deep_policy_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(deep(1000))
    r = run_cli("policy", "check", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "refused: nested more than 100 levels (line 1)" in r.stderr
    r = run_cli("serve", "--policy", str(path), "--port", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"invalid policy {path}" in r.stderr and "nested more than 100 levels" in r.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (deep(1000).encode(), "refused: nested more than 100 levels (line 1)"),
        (b"default:\n  template: 'hi \xff there'\n", "not UTF-8 text (byte 0xff) (line 2)"),
        (b"\xfe\xfe", "not UTF-8 text (byte 0xfe) (line 1)"),
    ],
)
def test_rules_files_that_cannot_be_read_name_the_file_and_line(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_bytes(content)
    with pytest.raises(RuleFileError) as info:
        load_rules(rules)
    assert str(info.value) == f"{rules / 'a.yaml'}: {expected}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(MINIMAL + "degradation: {rules: rules}\n")
    report = check_policy_file(policy, env={})
    assert report.policy is None
    assert report.errors == [f"degradation.rules: {rules / 'a.yaml'}: {expected}"]
    r = run_cli("policy", "check", str(policy))
    assert r.returncode == 1 and "Traceback" not in r.stderr and expected in r.stderr


@pytest.mark.parametrize(
    ("text", "path", "line", "first"),
    [
        # A second block for the same provider: it would silently replace the first.
        (
            MINIMAL.replace("pools:", '  a:\n    base_url: "http://evil.example/v1"\npools:'),
            "providers.a",
            3,
            2,
        ),
        (
            MINIMAL.replace(
                'a: {base_url: "http://127.0.0.1:1/v1"}',
                'a:\n    base_url: "http://127.0.0.1:1/v1"\n    max_inflight: 4\n    max_inflight: 0',
            ),
            "providers.a.max_inflight",
            5,
            4,
        ),
        (MINIMAL + "pools:\n  q: {members: [a]}\n", "pools", 7, 3),
        (
            MINIMAL.replace("{members: [a]}", "{members: [a], members: [a]}"),
            "pools.p.members",
            4,
            4,
        ),
        (
            MINIMAL + "classes:\n  - name: c\n    max_prompt_tokens: 5\n    name: d\n",
            "classes.0.name",
            10,
            8,
        ),
        (MINIMAL + "version: 1\nversion: 1\n", "version", 8, 7),
    ],
)
def test_duplicate_keys_are_refused_with_the_line_of_the_duplicate(
    text: str, path: str, line: int, first: int
) -> None:
    report = check_policy(text, env={})
    assert report.policy is None
    assert f"{path}: duplicate key (first given on line {first}) (line {line})" in report.errors


def test_the_value_used_is_the_last_and_errors_name_its_line() -> None:
    text = MINIMAL.replace(
        'a: {base_url: "http://127.0.0.1:1/v1"}',
        'a:\n    base_url: "http://127.0.0.1:1/v1"\n    max_inflight: 4\n    max_inflight: 0',
    )
    errors = check_policy(text, env={}).errors
    assert "providers.a.max_inflight: Input should be greater than or equal to 1 (line 5)" in errors


def test_keys_equal_as_yaml_values_are_duplicates() -> None:
    _, smap = load_yaml("1: a\n0x1: b\ntrue: c\n'1': d\n")
    assert [(d.path, d.line, d.first_line) for d in smap.duplicates] == [
        ("0x1", 2, 1),
        ("true", 3, 1),
    ]


def test_merge_keys_and_anchors_are_not_duplicates() -> None:
    text = """\
providers:
  a: &base {base_url: "http://127.0.0.1:1/v1", max_inflight: 2}
  b:
    <<: *base
    max_inflight: 3
pools:
  p: {members: [a, b]}
models:
  chat: {pool: p}
"""
    report = check_policy(text, env={})
    assert report.errors == [] and report.policy is not None
    assert report.policy.providers["b"].max_inflight == 3


def test_duplicate_keys_in_a_rules_file_are_refused_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(
        "rules:\n  - name: a\n    match: {aliases: [chat]}\n    template: x\n"
        "    template: 'y {alias}'\ndefault: {template: d}\ndefault: {template: e}\n"
    )
    with pytest.raises(RuleFileError) as info:
        load_file(path)
    err = info.value
    assert err.field_path == "rules[0].template" and err.line == 5
    assert str(err) == (
        f"{path}: rules[0].template: duplicate key (first given on line 4) (line 5); "
        "default: duplicate key (first given on line 6) (line 7)"
    )
