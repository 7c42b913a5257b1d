"""Request classes: ordered rules, first match wins, default otherwise."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from gateway.routing.class_rules import ClassRule, RequestFeatures, classify

RULES = [
    ClassRule(name="batch", priority=["low"]),
    ClassRule(name="long", min_prompt_tokens=8000),
    ClassRule(name="long-output", min_output_tokens=2000),
    ClassRule(name="vip", tenants=["acme"], aliases=["smart"]),
    ClassRule(name="interactive", max_total_tokens=4000),
]


def feats(prompt: int = 100, out: int = 100, **kw: str) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, expected_output_tokens=out, **kw)


def test_total_is_prompt_plus_output() -> None:
    assert feats(1200, 300).total_tokens == 1500


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (feats(100, 100), "interactive"),
        (feats(8000, 10), "long"),  # bounds are inclusive
        (feats(7999, 10), "default"),  # not long, and too big to be interactive
        (feats(3900, 100), "interactive"),
        (feats(100, 2500), "long-output"),
        (feats(9000, 2500), "long"),  # first match wins
        (feats(9000, 10, priority="low"), "batch"),
        (feats(3000, 1500, tenant="acme", alias="smart"), "vip"),
        (feats(3000, 1500, tenant="acme", alias="fast"), "default"),  # all conditions must hold
        (feats(3000, 1500), "default"),
    ],
)
def test_first_matching_rule_or_default(features: RequestFeatures, expected: str) -> None:
    assert classify(features, RULES, "default") == expected


def test_rule_without_conditions_matches_everything() -> None:
    assert classify(feats(), [ClassRule(name="all")], "default") == "all"
    assert classify(feats(), [], "default") == "default"


def test_empty_lists_are_unset_conditions() -> None:
    assert ClassRule(name="x", aliases=[], tenants=[]).matches(feats())


def test_rules_load_from_policy_data_and_reject_mistakes() -> None:
    rule = ClassRule.model_validate({"name": "long", "min_prompt_tokens": 8000})
    assert rule.min_prompt_tokens == 8000
    with pytest.raises(ValidationError):
        ClassRule.model_validate({"name": "x", "min_prompt_token": 1})  # typo
    with pytest.raises(ValidationError):
        ClassRule(name="x", min_total_tokens=10, max_total_tokens=5)
    with pytest.raises(ValidationError):
        ClassRule(name="x", max_prompt_tokens=-1)


def test_classify_is_cheap() -> None:
    f = feats(3000, 1500, tenant="other")
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        classify(f, RULES, "default")
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 50e-6  # measured ~2 us on a shared 2-core machine
