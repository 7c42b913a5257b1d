"""Cross-checks at the border: every error of a policy in one run (references included when a field
failed validation), loops and repeats in pools and aliases, inverted timeouts, an unknown format
version, catastrophic regexes in degradation rules, and a live reload that runs the very same
full check as `gateway policy check`, rules files included."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from gateway.infra.shared_state import SharedState
from gateway.policy.loader import PolicyError, check_policy, check_policy_file, load_policy
from gateway.policy.rules import MAX_REGEX_INPUT, RuleFileError, RuleMatch, load_rules
from gateway.policy.schema import Policy
from gateway.policy.watcher import PolicyReloader

GOOD = """\
version: 1
providers:
  sim-a:
    base_url: http://127.0.0.1:18301/v1
    max_inflight: 8
  sim-b:
    base_url: http://127.0.0.1:18301/v1
pools:
  main:
    members: [sim-a, sim-b]
    fallback: [spare]
  spare:
    members: [sim-b]
models:
  chat:
    pool: main
    default_max_tokens: 64
    context_window: 4096
"""


def errors(text: str) -> list[str]:
    return check_policy(text, env={}).errors


def test_every_error_is_reported_when_a_field_also_failed() -> None:
    text = (
        GOOD.replace("max_inflight: 8", "max_inflight: 0")
        .replace("[sim-a, sim-b]", "[sim-a, sim-x]")
        .replace("fallback: [spare]", "fallback: [nope]")
    )
    assert errors(text) == [
        "providers.sim-a.max_inflight: Input should be greater than or equal to 1 (line 5)",
        "pools.main.members: unknown provider 'sim-x' (line 10)",
        "pools.main.fallback: unknown pool 'nope' (line 11)",
    ]


def test_references_of_entries_of_the_wrong_shape_do_not_crash_the_check() -> None:
    text = GOOD.replace("members: [sim-b]", "members: 7").replace("pool: main", "pool: [x]")
    found = errors(text)
    assert any(e.startswith("pools.spare.members: ") for e in found)
    assert any(e.startswith("models.chat.pool: ") for e in found)


def _paths(node: object, path: str = "") -> list[str]:
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, f"{path}.{i}")
    return out


def _replaced(data: object, parts: list[str], value: object) -> object:
    if not parts:
        return value
    if isinstance(data, list):
        i = int(parts[0])
        return [*data[:i], _replaced(data[i], parts[1:], value), *data[i + 1 :]]
    assert isinstance(data, dict)
    return {**data, parts[0]: _replaced(data[parts[0]], parts[1:], value)}


def test_any_value_of_the_wrong_shape_is_an_error_never_an_exception() -> None:
    base = yaml.safe_load(GOOD + "classes: [{name: c, aliases: [chat]}]\ndefault_class: c\n")
    shapes: list[object] = [None, 7, -1.5, float("inf"), "s", [], [[1]], {"x": 1}, {"1": [None]}]
    for path in _paths(base):
        for shape in shapes:
            text = yaml.safe_dump(_replaced(base, path.split("."), shape))
            report = check_policy(text, env={})  # must not raise
            assert report.policy is not None or report.errors, (path, shape)


def test_a_policy_built_directly_still_checks_its_references() -> None:
    with pytest.raises(ValueError, match="pools.main.members: unknown provider 'ghost'"):
        Policy.model_validate(
            {
                "providers": {"a": {"base_url": "http://h:1/v1"}},
                "pools": {"main": {"members": ["ghost"]}},
                "models": {"chat": {"pool": "main"}},
            }
        )


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        (
            "[sim-a, sim-b]",
            "[sim-a, sim-a, sim-a]",
            "pools.main.members: listed more than once: sim-a (line 10)",
        ),
        (
            "fallback: [spare]",
            "fallback: [spare, spare]",
            "pools.main.fallback: listed more than once: spare (line 11)",
        ),
        (
            "fallback: [spare]",
            "fallback: [main]",
            "pools.main.fallback: a pool cannot fall back to itself (line 11)",
        ),
        (
            "context_window: 4096",
            "context_window: 4096\n    fallback_alias: chat",
            "models.chat.fallback_alias: an alias cannot fall back to itself (line 19)",
        ),
        (
            "context_window: 4096",
            "context_window: 10",
            "models.chat.context_window: 10 tokens is less than default_max_tokens (64): the "
            "expected output alone does not fit (line 18)",
        ),
        (
            "max_inflight: 8",
            "max_inflight: 8\n    timeouts: {total_s: 1, first_byte_s: 100}",
            "providers.sim-a.timeouts: total_s (1) is shorter than first_byte_s (100): that "
            "limit could never apply (line 6)",
        ),
        ("version: 1", "version: 99", "version: Input should be 1 (line 1)"),
    ],
)
def test_what_cannot_work_is_an_error(old: str, new: str, error: str) -> None:
    assert errors(GOOD.replace(old, new)) == [error]


def test_a_short_total_under_default_limits_is_fine() -> None:
    # Only limits given explicitly are compared: defaults above total_s are capped by it.
    text = GOOD.replace("max_inflight: 8", "max_inflight: 8\n    timeouts: {total_s: 1.5}")
    assert errors(text) == []


def test_limits_the_total_caps_are_warnings() -> None:
    text = GOOD.replace(
        "max_inflight: 8", "max_inflight: 8\n    timeouts: {total_s: 5, connect_s: 10, idle_s: 20}"
    )
    report = check_policy(text, env={})
    assert report.errors == [] and report.policy is not None
    assert report.warnings == [
        "providers.sim-a.timeouts.connect_s: 10 s is longer than total_s (5): it never applies "
        "(line 6)",
        "providers.sim-a.timeouts.idle_s: 20 s is longer than total_s (5): it never applies "
        "(line 6)",
    ]


def test_loops_the_router_cuts_are_warnings() -> None:
    report = check_policy(
        GOOD.replace("members: [sim-b]", "members: [sim-b]\n    fallback: [main]")
    )
    assert report.errors == [] and report.policy is not None
    assert report.warnings == [
        "pools.main.fallback: fallbacks loop back to this pool (main -> spare -> main); each pool "
        "is tried once (line 11)"
    ]
    text = GOOD.replace(
        "context_window: 4096",
        "context_window: 4096\n    fallback_alias: chat2\n"
        "  chat2: {pool: main, context_window: 2048, fallback_alias: chat}",
    )
    report = check_policy(text, env={})
    assert report.errors == []
    assert report.warnings == [
        "models.chat.fallback_alias: fallback aliases loop back to this alias (chat -> chat2 -> "
        "chat); a prompt too long for all of them is refused (line 19)",
        "models.chat2.fallback_alias: fallback aliases loop back to this alias (chat2 -> chat -> "
        "chat2); a prompt too long for all of them is refused (line 20)",
    ]


def test_a_fallback_alias_with_no_larger_window_is_a_warning() -> None:
    text = GOOD.replace(
        "context_window: 4096",
        "context_window: 4096\n    fallback_alias: small\n  small: {pool: main, context_window: 1024}",
    )
    report = check_policy(text, env={})
    assert report.errors == [] and len(report.warnings) == 1
    assert report.warnings[0].startswith("models.chat.fallback_alias: 'small' has a context window")


# ---- degradation rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "regex",
    ["^(a+)+$", "(a*)*", r"(\w+\s?)+$", "(?:x(?:ab|c+))*y", "(a+){50}", "(a|aa)*c", "(a|a)+"],
)
def test_backtracking_regexes_are_refused_with_their_line(tmp_path: Path, regex: str) -> None:
    (tmp_path / "a.yaml").write_text(
        f"rules:\n  - name: evil\n    match:\n      regex: '{regex}'\n    template: t\n"
    )
    with pytest.raises(RuleFileError) as info:
        load_rules(tmp_path)
    assert info.value.field_path == "rules[0].match.regex" and info.value.line == 4
    assert "exponential time" in str(info.value)


@pytest.mark.parametrize(
    "regex", ["(?>a+)+", "(a++)+", "(foo|bar)+", r"\d+-\d+", "(ab){2,5}", "(ab|a)*", "(?>a|aa)*"]
)
def test_regexes_that_cannot_blow_up_pass(regex: str) -> None:
    assert RuleMatch(regex=regex).regex == regex


def test_a_regex_runs_on_a_bounded_prefix() -> None:
    rule = RuleMatch(regex="a*b")  # quadratic: passes the check, bounded by the input cap
    text = "a" * (MAX_REGEX_INPUT * 50)
    started = time.perf_counter()
    assert not rule.matches("m", "c", "t", text, text)
    assert time.perf_counter() - started < 2.0
    assert RuleMatch(regex="^x").matches("m", "c", "t", "x" + "y" * 10**6, "")


def test_retry_after_in_rules_is_finite_and_bounded(tmp_path: Path) -> None:
    for value, problem in ((".inf", "finite"), ("1e9", "less than or equal")):
        (tmp_path / "a.yaml").write_text(f"default:\n  template: t\n  retry_after_s: {value}\n")
        with pytest.raises(RuleFileError) as info:
            load_rules(tmp_path)
        assert info.value.field_path == "default.retry_after_s" and info.value.line == 3
        assert problem in str(info.value)


# ---- the full check: policy check, start-up and reload alike --------------------------------


def write_policy(tmp_path: Path, rules: str | None) -> Path:
    path = tmp_path / "policy.yaml"
    extra = f"degradation: {{rules: {rules}}}\n" if rules else ""
    path.write_text(GOOD + extra)
    return path


def bad_regex_rules(tmp_path: Path) -> str:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "a.yaml").write_text(
        "rules:\n  - name: evil\n    match:\n      regex: '(unclosed'\n    template: x\n"
    )
    return "rules"


def test_load_policy_runs_the_rules_check(tmp_path: Path) -> None:
    path = write_policy(tmp_path, bad_regex_rules(tmp_path))
    with pytest.raises(PolicyError) as info:
        load_policy(path, env={})
    assert info.value.problems[0].startswith(
        f"degradation.rules: {tmp_path / 'rules' / 'a.yaml'}: rules[0].match.regex: invalid"
    )
    assert info.value.problems[0].endswith("(line 4)")


@pytest.mark.parametrize("kind", ["bad_regex", "missing"])
async def test_reload_refuses_what_policy_check_refuses(tmp_path: Path, kind: str) -> None:
    path = write_policy(tmp_path, None)
    applied: list[Policy] = []

    def apply(policy: Policy) -> str:
        applied.append(policy)
        return f"v{len(applied)}"

    state = SharedState(None)
    reloader = PolicyReloader(str(path), apply, state, "test")
    try:
        assert await reloader.reload(publish=False) == "v1"
        rules = bad_regex_rules(tmp_path) if kind == "bad_regex" else "./does-not-exist"
        write_policy(tmp_path, rules)
        expected = check_policy_file(path, env={}).errors
        assert expected, "policy check must refuse it"
        assert await reloader.reload(publish=False) is None
        assert len(applied) == 1  # the running policy stays
        assert reloader.last_error == expected
        assert reloader.failures == 1
    finally:
        await state.aclose()
