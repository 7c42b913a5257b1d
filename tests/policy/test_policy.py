"""Policy files: validation with field paths, ${ENV} interpolation, the CLI check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.policy import PolicyError, load_policy, parse_policy
from tests.support import ROOT

MINIMAL = """
providers:
  a: {base_url: "http://127.0.0.1:1/v1"}
pools:
  p: {members: [a]}
models:
  chat: {pool: p}
"""


def test_shipped_policies_are_valid() -> None:
    paths = sorted((ROOT / "policies").glob("*.yaml"))
    assert paths, "no policies/*.yaml found"
    for path in paths:
        assert load_policy(path, env={}).models, path


def test_unknown_field_is_named() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(
            MINIMAL.replace(
                'base_url: "http://127.0.0.1:1/v1"', 'base_url: "http://x/v1", bogus: 1'
            )
        )
    assert any(p.startswith("providers.a.bogus:") for p in e.value.problems)


def test_wrong_type_is_named() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(MINIMAL.replace("members: [a]", "members: [a], max_attempts: lots"))
    assert any(p.startswith("pools.p.max_attempts:") for p in e.value.problems)


def test_dangling_reference_is_named() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(MINIMAL.replace("members: [a]", "members: [a, ghost]"))
    assert "pools.p.members: unknown provider 'ghost' (line 5)" in e.value.problems


def test_env_interpolation_and_missing_env() -> None:
    text = MINIMAL.replace('"http://127.0.0.1:1/v1"', '"${UP_URL}"')
    p = parse_policy(text, env={"UP_URL": "http://10.0.0.1:8000/v1"})
    assert p.providers["a"].base_url == "http://10.0.0.1:8000/v1"
    with pytest.raises(PolicyError) as e:
        parse_policy(text, env={})
    assert (
        "providers.a.base_url: environment variable UP_URL is not set (line 3)" in e.value.problems
    )
    p = parse_policy(
        MINIMAL.replace('"http://127.0.0.1:1/v1"', '"${UP_URL:-http://h:1/v1}"'), env={}
    )
    assert p.providers["a"].base_url == "http://h:1/v1"


def test_plaintext_key_is_refused() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(MINIMAL + "auth:\n  keys:\n    - {tenant: t, key: sk-plain}\n")
    assert any(p.startswith("auth.keys.0.key:") for p in e.value.problems)


def test_cli_check(tmp_path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("pool: p", "pool: nowhere"))
    ok = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(good)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(bad)],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0
    assert "models.chat.pool: unknown pool 'nowhere'" in res.stderr
