"""`retry.deadline_s` and a model's own `models.<alias>.deadline_s`: validated like the attempts'
own limits, and the policy check warns when a member's first-byte limit is longer than either
(that limit could then never apply), or a model's deadline is not shorter than the policy's."""

from __future__ import annotations

import pytest

from gateway.policy.loader import check_policy

POLICY = """\
version: 1
providers:
  sim-a:
    base_url: http://127.0.0.1:18301/v1
    timeouts: {first_byte_s: 20}
  sim-b:
    base_url: http://127.0.0.1:18302/v1
pools:
  main: {members: [sim-a, sim-b]}
models:
  chat: {pool: main}
retry: {deadline_s: DEADLINE}
"""


@pytest.mark.parametrize("value", ["0", "-1", ".inf", ".nan", "86401", "'soon'"])
def test_a_deadline_that_cannot_work_is_refused(value: str) -> None:
    report = check_policy(POLICY.replace("DEADLINE", value), env={})
    assert report.policy is None
    assert any(e.startswith("retry.deadline_s:") for e in report.errors), report.errors


def test_a_deadline_below_a_given_first_byte_limit_is_a_warning() -> None:
    report = check_policy(POLICY.replace("DEADLINE", "10"), env={})
    assert report.errors == [] and report.policy is not None
    assert report.policy.retry.deadline_s == 10
    # sim-b's first_byte_s is the default (30): only limits given are compared, as for total_s.
    assert report.warnings == [
        "providers.sim-a.timeouts.first_byte_s: 20 s is longer than retry.deadline_s (10): it "
        "never applies, a member that slow is cut by the deadline instead of failed over "
        "(line 5)"
    ]


def test_no_deadline_is_the_default_and_warns_of_nothing() -> None:
    report = check_policy(POLICY.replace("retry: {deadline_s: DEADLINE}\n", ""), env={})
    assert report.errors == [] and report.warnings == []
    assert report.policy is not None and report.policy.retry.deadline_s is None


MODEL = POLICY.replace("retry: {deadline_s: DEADLINE}\n", "").replace(
    "chat: {pool: main}", "chat: {pool: main, deadline_s: DEADLINE}"
)


@pytest.mark.parametrize("value", ["0", "-1", ".inf", ".nan", "86401", "'soon'"])
def test_a_model_deadline_that_cannot_work_is_refused(value: str) -> None:
    report = check_policy(MODEL.replace("DEADLINE", value), env={})
    assert report.policy is None
    assert any(e.startswith("models.chat.deadline_s:") for e in report.errors), report.errors


def test_a_model_deadline_below_a_members_first_byte_limit_is_a_warning() -> None:
    report = check_policy(MODEL.replace("DEADLINE", "10"), env={})
    assert report.errors == [] and report.policy is not None
    assert report.policy.models["chat"].deadline_s == 10
    assert report.warnings == [
        "models.chat.deadline_s: 10 s is shorter than member sim-a's first_byte_s (20): a "
        "member that slow is cut by the deadline instead of failed over (line 11)"
    ]
    assert check_policy(MODEL.replace("DEADLINE", "25"), env={}).warnings == []


def test_a_model_deadline_the_policys_always_overrules_is_a_warning() -> None:
    text = MODEL.replace("DEADLINE", "25") + "retry: {deadline_s: 25}\n"
    report = check_policy(text, env={})
    assert report.errors == [] and report.policy is not None
    assert report.warnings[-1] == (
        "models.chat.deadline_s: 25 s is not shorter than retry.deadline_s (25): it never "
        "applies (line 11)"
    )
