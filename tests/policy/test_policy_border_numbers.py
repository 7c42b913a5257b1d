"""Numbers at the border: inf, nan and absurd sizes in every numeric setting of the policy are
refused before traffic, with path and line; at run time a failing finish observer costs a request
none of its other observations (access log, metrics, spend)."""

from __future__ import annotations

import logging
import math
import time
import types
import typing
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gateway.context import Context
from gateway.governance.spend import MAX_REQUEST_COST_NANO, cost_nano
from gateway.pipeline.stages.record import Record
from gateway.policy.loader import check_policy
from gateway.policy.schema import Policy

MINIMAL = """\
providers:
  a: {base_url: "http://127.0.0.1:1/v1"}
pools:
  p: {members: [a]}
models:
  chat: {pool: p}
"""
# Names used for the entries of the policy's mappings (providers.a, pools.p, ...).
KEYS = {"providers": "a", "pools": "p", "models": "chat"}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    out = []
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            out.append(arg)
        elif typing.get_args(arg):
            out.extend(_models_in(arg))
    return out


def _numbers_in(annotation: Any) -> set[type]:
    found: set[type] = set()
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for a in args:
            found |= _numbers_in(a)
    elif typing.get_origin(annotation) is typing.Annotated:
        found |= _numbers_in(args[0])
    elif annotation in (int, float):
        found.add(annotation)
    return found


def numeric_fields(model: type[BaseModel] = Policy, path: str = "") -> list[tuple[str, type]]:
    """(dotted path, int or float) of every numeric setting reachable from the policy, with the
    entries of mappings named by KEYS (or "x") and of lists by index 0."""
    out: list[tuple[str, type]] = []
    for name, field in model.model_fields.items():
        here = f"{path}.{name}" if path else name
        for kind in _numbers_in(field.annotation):
            out.append((here, kind))
        origin = typing.get_origin(field.annotation)
        for sub in _models_in(field.annotation):
            if origin is dict:
                out.extend(numeric_fields(sub, f"{here}.{KEYS.get(name, 'x')}"))
            elif origin is list:
                out.extend(numeric_fields(sub, f"{here}.0"))
            else:
                out.extend(numeric_fields(sub, here))
    return out


FLOATS = sorted({p for p, kind in numeric_fields() if kind is float})
DURATIONS = sorted({p for p, _ in numeric_fields() if p.endswith(("_s", "_ms"))})


def with_value(path: str, value: Any) -> str:
    data = yaml.safe_load(MINIMAL)
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        if part.isdigit():
            while len(node) <= int(part):
                node.append({"name": "c"})
            node = node[int(part)]
        else:
            node = node.setdefault(part, [] if part == "classes" else {})
    node[parts[-1]] = value
    return yaml.safe_dump(data)


def errors_at(text: str, path: str) -> list[str]:
    """Errors naming `path`, or its model when that model's own check refused the value
    (breaker: max_cooldown_s must be >= cooldown_s)."""
    report = check_policy(text, env={})
    parent = path.rpartition(".")[0]
    return [e for e in report.errors if e.startswith((f"{path}: ", f"{parent}: "))]


def test_the_walk_sees_the_settings_of_every_part() -> None:
    for expected in (
        "providers.a.timeouts.total_s",
        "providers.a.price.input_per_1m",
        "pools.p.affinity.epsilon",
        "pools.p.balancer.decay_s",
        "models.chat.cache.semantic.ttl_s",
        "semantic_cache.threshold",
        "governance.tenants.x.budget.daily_usd",
        "retry.base_backoff_ms",
    ):
        assert expected in FLOATS
    assert "models.chat.cache.exact.ttl_s" in DURATIONS


@pytest.mark.parametrize("path", FLOATS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused_everywhere(path: str, value: float) -> None:
    text = with_value(path, value)
    found = errors_at(text, path)
    assert found, f"{path}: {value} accepted: {check_policy(text, env={}).errors}"
    assert any("finite" in e or "greater" in e or "less" in e for e in found), found
    assert all("(line " in e for e in found)


@pytest.mark.parametrize("path", FLOATS)
def test_inf_spelled_as_text_is_refused_too(path: str) -> None:
    # "1e999" is a string to YAML (no dot) and inf once pydantic reads it as a float.
    assert errors_at(with_value(path, "1e999"), path)


@pytest.mark.parametrize("path", DURATIONS)
def test_durations_and_ttls_are_at_most_a_year(path: str) -> None:
    huge = 10**13 if path.endswith("_ms") else 10**10
    assert errors_at(with_value(path, huge), path)


def test_the_probe_files() -> None:
    cases = {
        "exact: {enabled: true, ttl_s: 99999999999999999999}": "models.chat.cache.exact.ttl_s: "
        "1e+20 s is longer than a year: not a usable duration (line 6)",
        "semantic: {enabled: false, ttl_s: .inf}": "models.chat.cache.semantic.ttl_s: "
        "must be a finite number, not inf (line 6)",
    }
    for cache, error in cases.items():
        text = MINIMAL.replace("{pool: p}", "{pool: p, cache: {" + cache + "}}")
        assert check_policy(text, env={}).errors == [error]
    text = MINIMAL.replace("{members: [a]}", "{members: [a], affinity: {epsilon: .inf}}")
    assert errors_at(text, "pools.p.affinity.epsilon") == [
        "pools.p.affinity.epsilon: must be a finite number, not inf (line 4)"
    ]
    text = MINIMAL.replace('1/v1"}', '1/v1", price: {input_per_1m: .inf, output_per_1m: .nan}}')
    assert check_policy(text, env={}).errors == [
        "providers.a.price.input_per_1m: Input should be a finite number (line 2)",
        "providers.a.price.output_per_1m: Input should be a finite number (line 2)",
    ]


def test_sane_values_still_pass() -> None:
    text = MINIMAL.replace(
        '1/v1"}',
        '1/v1", timeouts: {total_s: 3600, first_byte_s: 60}, price: {input_per_1m: 75}}',
    ).replace("{pool: p}", "{pool: p, cache: {exact: {enabled: true, ttl_s: 2592000}}}")
    report = check_policy(text, env={})
    assert report.errors == [] and report.policy is not None


def test_a_failing_observer_costs_no_other_observation(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def spend(ctx: Context) -> None:
        raise OverflowError("cannot convert float infinity to integer")

    def metrics(ctx: Context) -> None:
        seen.append("metrics")

    def access_log(ctx: Context) -> None:
        seen.append("log")

    caplog.set_level(logging.ERROR, logger="gateway.record")
    ctx = Context("req-1", time.perf_counter())
    Record([spend, metrics, access_log]).record(ctx)
    assert seen == ["metrics", "log"]
    assert "req-1" in caplog.text and "OverflowError" in caplog.text


def test_cost_never_raises() -> None:
    assert cost_nano(1000, 1000, 1.0, 2.0) == 3_000_000
    assert cost_nano(10, 10, math.inf, 0.0) == MAX_REQUEST_COST_NANO
    assert cost_nano(10, 10, math.nan, 1.0) == 0
    assert cost_nano(10**9, 10**9, 1e300, 1e300) == MAX_REQUEST_COST_NANO
