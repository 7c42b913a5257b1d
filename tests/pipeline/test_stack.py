"""The alias's stack is composed from its policy: stages an alias does not use are left out."""

from __future__ import annotations

from gateway.pipeline.stack import Pipeline
from tests.pipeline.conftest import runtime


def names(pipeline: Pipeline, alias: str = "chat") -> list[str]:
    return [s.name for s in pipeline.alias_stages(pipeline.runtime.snapshot, alias)]


NO_CACHE = {"cache": {"exact": {"enabled": False}}}


def test_an_alias_that_caches_nothing_has_no_cache_stage() -> None:
    assert names(Pipeline(runtime(alias=NO_CACHE))) == ["classify", "limit"]


def test_the_exact_cache_is_on_by_default() -> None:
    assert names(Pipeline(runtime())) == ["classify", "limit", "cache"]


def test_the_cache_stage_follows_the_longer_context_alias_it_reroutes_to() -> None:
    rt = runtime(
        alias={**NO_CACHE, "context_window": 100, "fallback_alias": "long"},
        models={"long": {"pool": "main"}},
    )
    assert names(Pipeline(rt)) == ["classify", "limit", "cache"]


def test_degradation_rules_add_the_degrade_stage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = runtime(alias=NO_CACHE, degradation={"rules": str(tmp_path)})
    assert names(Pipeline(rt)) == ["classify", "limit", "degrade"]


def test_stacks_are_built_once_per_policy_version() -> None:
    pipeline = Pipeline(runtime())
    snap = pipeline.runtime.snapshot
    assert pipeline._stack(snap, "chat") is pipeline._stack(snap, "chat")
