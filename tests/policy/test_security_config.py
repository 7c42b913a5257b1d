"""Auth fails closed and configuration mistakes are caught before traffic.

Gateway keys: a key source that yields no key is a start-up error, keys split on the first colon,
empty and bare keys refused. `gateway policy check`: every cross-reference error and unset variable
with its field path and line; YAML errors name the file; credentials in URLs, GATEWAY_* variables
as provider keys and YAML bombs refused.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.governance.static_keys import KeyConfigError, KeyRing, hash_key, parse_api_keys
from gateway.policy import PolicyError, parse_policy
from gateway.policy.loader import check_policy
from gateway.policy.schema import Auth
from tests.support import ROOT, free_port

BASE = """\
providers:
  a: {base_url: "http://127.0.0.1:9/v1"}
pools:
  p: {members: [a]}
models:
  chat: {pool: p}
"""


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gateway ...` as its own process (what an operator runs)."""
    import os

    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=60,
    )


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gateway policy check ...`, in this process (the same command, without the start-up)."""
    from typer.testing import CliRunner

    from gateway.cli import app

    r = CliRunner().invoke(app, ["policy", "check", *args], env=env)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


# -- gateway keys -------------------------------------------------------------------------------


def test_unset_key_env_is_an_error_not_an_open_gateway() -> None:
    auth = Auth.model_validate({"keys": [{"tenant": "t", "key_env": "SECIN_UNSET_KEY"}]})
    with pytest.raises(KeyConfigError, match=r"auth\.keys\.0\.key_env: .*SECIN_UNSET_KEY"):
        KeyRing(auth, env={})
    with pytest.raises(KeyConfigError):
        KeyRing(auth, env={"SECIN_UNSET_KEY": "  "})
    text = BASE + "auth:\n  keys:\n    - {tenant: t, key_env: SECIN_UNSET_KEY}\n"
    with pytest.raises(PolicyError) as e:
        parse_policy(text, env={})
    assert any(
        p.startswith("auth.keys.0.key_env: environment variable SECIN_UNSET_KEY is unset")
        and p.endswith("(line 9)")
        for p in e.value.problems
    ), e.value.problems


def test_serve_refuses_to_start_without_its_keys(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE + "auth:\n  keys:\n    - {tenant: t, key_env: SECIN_UNSET_KEY}\n")
    port = str(free_port())
    started = time.monotonic()
    r = cli("serve", "--port", port, "--policy", str(policy), env={"SECIN_UNSET_KEY": ""})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "auth.keys.0.key_env" in r.stderr and "SECIN_UNSET_KEY" in r.stderr
    assert time.monotonic() - started < 30
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
    r = cli(
        "serve",
        "--port",
        port,
        "--policy",
        str(policy),
        env={"SECIN_UNSET_KEY": "k", "GATEWAY_API_KEYS": "alice:"},
    )
    assert r.returncode == 2 and "GATEWAY_API_KEYS entry 1 (tenant 'alice'): empty key" in r.stderr


def test_api_keys_split_on_the_first_colon_and_refuse_empty_or_bare_keys() -> None:
    assert parse_api_keys("bob:key:with:colon, carol:k2") == [
        ("bob", "key:with:colon"),
        ("carol", "k2"),
    ]
    ring = KeyRing(Auth(), env={"GATEWAY_API_KEYS": "bob:key:with:colon"})
    assert ring.tenant_for("Bearer key:with:colon") == "bob"
    with pytest.raises(GatewayError):
        ring.tenant_for("Bearer colon")
    for bad, says in (
        ("alice:", "empty key"),
        ("alice:   ", "empty key"),
        ("barekey", "no tenant"),
        (":k", "empty tenant"),
    ):
        with pytest.raises(KeyConfigError, match=says):
            KeyRing(Auth(), env={"GATEWAY_API_KEYS": bad})


def test_empty_bearer_is_refused() -> None:
    ring = KeyRing(
        Auth.model_validate({"keys": [{"tenant": "t", "key_sha256": hash_key("")}]}), env={}
    )
    for header in ("Bearer ", "Bearer    ", "bearer", None, ""):
        with pytest.raises(GatewayError) as e:
            ring.tenant_for(header)
        assert e.value.status == 401


def test_policy_check_reports_bad_api_keys_variable(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE)
    r = check(str(policy), env={"GATEWAY_API_KEYS": "alice:,bob:x"})
    assert r.returncode == 1
    assert "GATEWAY_API_KEYS entry 1 (tenant 'alice'): empty key" in r.stderr


# -- policy check: cross references, variables, lines -------------------------------------------

BROKEN = """\
providers:
  a:
    base_url: "http://127.0.0.1:9/v1"
    api_key_env: SECIN_PROVIDER_KEY
  b: {base_url: "http://127.0.0.1:9/v1"}
pools:
  fast: {members: [a, ghost], fallback: [nowhere]}
  big: {members: [b]}
classes:
  - name: interactive
    max_prompt_tokens: 100
    aliases: [chta]
  - name: long
default_class: lnog
models:
  chat:
    pool: fast
    routes: {interactve: fast, long: bgi}
    fallback_alias: chat-long
auth:
  keys:
    - {tenant: team-a, key_env: SECIN_TEAM_A_KEY}
"""


def test_policy_check_reports_every_problem_with_path_and_line(tmp_path: Path) -> None:
    policy = tmp_path / "broken.yaml"
    policy.write_text(BROKEN)
    r = check(str(policy))
    assert r.returncode == 1, r.stdout
    out = r.stderr
    expected_errors = [
        "pools.fast.members: unknown provider 'ghost' (line 7)",
        "pools.fast.fallback: unknown pool 'nowhere' (line 7)",
        "classes.0.aliases.0: unknown model 'chta' (line 12)",
        "default_class: 'lnog' is neither a class in classes nor routed by any model",
        "models.chat.routes.interactve: unknown class 'interactve'",
        "models.chat.routes.long: unknown pool 'bgi' (line 18)",
        "models.chat.fallback_alias: unknown alias 'chat-long' (line 19)",
        "auth.keys.0.key_env: environment variable SECIN_TEAM_A_KEY is unset or empty",
    ]
    for e in expected_errors:
        assert f"error: {e}" in out, f"missing: {e}\n{out}"
    assert "default_class: 'lnog'" in out and "(line 14)" in out
    assert "models.chat.routes.interactve: unknown class 'interactve' (classes: " in out
    # Provider key unset: a warning, not an error.
    assert (
        "warning: providers.a.api_key_env: environment variable SECIN_PROVIDER_KEY is not set"
        in out
    )
    assert "(line 4)" in out


def test_unset_provider_key_is_only_a_warning(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE.replace('9/v1"}', '9/v1", api_key_env: SECIN_PROVIDER_KEY}'))
    r = check(str(policy))
    assert r.returncode == 0, r.stderr
    assert "warning: providers.a.api_key_env" in r.stderr and "(line 2)" in r.stderr
    assert "1 warnings" in r.stdout


def test_unset_variable_in_a_provider_header_is_a_warning() -> None:
    text = BASE.replace('9/v1"}', '9/v1", headers: {api-key: "${SECIN_AZURE_KEY}"}}')
    report = check_policy(text, env={})
    assert report.policy is not None and not report.errors
    assert report.warnings == [
        "providers.a.headers.api-key: environment variable SECIN_AZURE_KEY is not set: sent empty"
        " (line 2)"
    ]
    gateway_side = check_policy(BASE.replace("127.0.0.1:9", "${SECIN_HOST}"), env={})
    assert gateway_side.errors[0] == (
        "providers.a.base_url: environment variable SECIN_HOST is not set (line 2)"
    )


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    policy = tmp_path / "typo.yaml"
    policy.write_text("providers: [this is not: yaml\n")
    r = check(str(policy))
    assert r.returncode == 1
    assert f"{policy}: invalid YAML" in r.stderr and "line 1" in r.stderr


@pytest.mark.parametrize(
    "url", ["http://user:secret@10.0.0.1/v1", "https://:token@api.example.com/v1"]
)
def test_base_url_with_credentials_is_refused(url: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(BASE.replace("http://127.0.0.1:9/v1", url))
    assert any(
        p.startswith("providers.a.base_url:") and "credentials" in p and "(line 2)" in p
        for p in e.value.problems
    ), e.value.problems
    assert not any("secret" in p or "token@" in p for p in e.value.problems)


def test_header_values_with_newlines_are_refused() -> None:
    text = BASE.replace('9/v1"}', '9/v1", headers: {x-note: "a\\r\\nx-evil: 1"}}')
    with pytest.raises(PolicyError) as e:
        parse_policy(text)
    assert any("providers.a.headers" in p and "control character" in p for p in e.value.problems)


# -- which variables a policy may read ----------------------------------------------------------


def test_provider_keys_never_come_from_gateway_variables() -> None:
    for name in ("GATEWAY_ADMIN_KEY", "GATEWAY_API_KEYS", "gateway_whatever"):
        with pytest.raises(PolicyError) as e:
            parse_policy(BASE.replace('9/v1"}', f'9/v1", api_key_env: {name}}}'))
        assert any(p.startswith("providers.a.api_key_env:") for p in e.value.problems)


def test_policy_cannot_interpolate_gateway_secrets() -> None:
    env = {"GATEWAY_ADMIN_KEY": "admin-secret", "TEAM_KEY": "tenant-secret"}
    for ref in ("${GATEWAY_ADMIN_KEY}", "${GATEWAY_API_KEYS}", "${TEAM_KEY}"):
        text = (
            BASE.replace('9/v1"}', f'9/v1", headers: {{authorization: "Bearer {ref}"}}}}')
            + "auth:\n  keys:\n    - {tenant: t, key_env: TEAM_KEY}\n"
        )
        with pytest.raises(PolicyError) as e:
            parse_policy(text, env=env)
        assert any(p.startswith("providers.a.headers.authorization:") for p in e.value.problems)
        assert "secret" not in str(e.value)


def test_allowed_provider_key_prefixes() -> None:
    text = "provider_key_env_prefixes: [LLM_KEY_]\n" + BASE.replace(
        '9/v1"}', '9/v1", api_key_env: HOME}'
    )
    with pytest.raises(PolicyError) as e:
        parse_policy(text, env={"HOME": "/root"})
    assert any("does not start with an allowed prefix (LLM_KEY_)" in p for p in e.value.problems)
    ok = text.replace("api_key_env: HOME", "api_key_env: LLM_KEY_A")
    assert parse_policy(ok, env={"LLM_KEY_A": "k"}).providers["a"].api_key_env == "LLM_KEY_A"


# -- YAML that cannot hurt the process ----------------------------------------------------------


def test_yaml_alias_bomb_is_refused_fast() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        bomb += f"{cur}: &{cur} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"  # noqa: E501
    assert len(bomb) < 1000  # ~400 million leaves once expanded
    started = time.perf_counter()
    report = check_policy(bomb, "bomb.yaml")
    assert time.perf_counter() - started < 1.0
    assert report.policy is None
    assert report.errors[0].startswith("bomb.yaml: refused: the document expands to more than")


def test_oversized_policy_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(BASE + "# " + "x" * (2 * 1024 * 1024) + "\n")
    r = check(str(big))
    assert r.returncode == 1 and "larger than" in r.stderr


def test_anchors_still_work_and_errors_keep_their_lines() -> None:
    text = """\
providers:
  a: {base_url: "http://127.0.0.1:9/v1", timeouts: &t {connect_s: 1.5}}
  b: {base_url: "http://127.0.0.1:9/v1", timeouts: *t}
pools:
  p: {members: [a, b]}
models:
  chat: {pool: p}
"""
    policy = check_policy(text).policy
    assert policy is not None and policy.providers["b"].timeouts.connect_s == 1.5
    report = check_policy(text.replace("connect_s: 1.5", "connect_s: -1"))
    assert "providers.a.timeouts.connect_s: Input should be greater than 0 (line 2)" in (
        report.errors
    )


def test_degradation_rule_files_are_bounded_too(tmp_path: Path) -> None:
    from gateway.resilience.degrade_rules import RuleFileError, load_file

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        bomb += f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    path = tmp_path / "rules.yaml"
    path.write_text(bomb)
    started = time.perf_counter()
    with pytest.raises(RuleFileError, match="refused: the document expands"):
        load_file(path)
    assert time.perf_counter() - started < 1.0


def million_leaves() -> str:
    """~400 bytes of YAML anchors that expand to a million leaves."""
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 6):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        text += f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    return text


def test_a_yaml_bomb_reload_neither_applies_nor_stalls_the_gateway(tmp_path: Path) -> None:
    from tests.policy.test_reload import serve, write_atomic

    policy = tmp_path / "policy.yaml"
    policy.write_text(BASE)
    with serve(policy, tmp_path / "gw.log") as served:
        version = served.ready()["policy_version"]
        write_atomic(policy, million_leaves())  # the file watcher picks it up
        slowest = 0.0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert httpx.get(served.url + "/health", timeout=10).status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.05)
        assert slowest < 0.5, f"the event loop stalled for {slowest:.1f} s"
        r = httpx.post(served.url + "/admin/reload", timeout=10)
        assert r.status_code == 400
        assert "refused: the document expands to more than" in r.json()["errors"][0]
        assert served.ready()["policy_version"] == version


def test_policy_check_loads_the_degradation_rules_it_names(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(
        "rules:\n  - name: r1\n    match: {classes: [bacth], aliases: [chta]}\n    template: 'x'\n"
    )
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE + "degradation: {rules: rules}\n")
    r = check(str(policy))
    assert r.returncode == 0, r.stderr
    assert "degradation rule 'r1': match.classes: unknown class 'bacth'" in r.stderr
    assert "degradation rule 'r1': match.aliases: unknown model 'chta'" in r.stderr
    (rules / "r.yaml").write_text("rules: [this is not: yaml\n")
    r = check(str(policy))
    assert r.returncode == 1 and "degradation.rules:" in r.stderr and "r.yaml" in r.stderr
