"""The provider adapter seam: registry by `type:`, per-type settings, the openai fast path."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from gateway.context import Context
from gateway.pipeline.attempt import Attempt
from gateway.policy.loader import PolicyError, parse_policy
from gateway.policy.schema import TYPE_SECTIONS, Provider
from gateway.providers.base import Adapter, UnsupportedEndpoint
from gateway.providers.registry import ADAPTERS, make_adapter
from gateway.providers.settings import ProviderType
from gateway.resilience.admission import Admission
from gateway.resilience.failures import (
    FailureKind,
    counts_against_breaker,
    failure_kind,
    is_retryable,
)
from gateway.runtime import Runtime

POLICY = """
providers:
  a:
    base_url: http://127.0.0.1:9/v1
    {extra}
pools:
  main: {{members: [a]}}
models:
  chat: {{pool: main}}
"""


def test_every_type_has_an_adapter_and_every_adapter_a_type() -> None:
    assert set(ADAPTERS) == set(get_args(ProviderType))
    for name, cls in ADAPTERS.items():
        assert issubclass(cls, Adapter) and cls.type == name
    assert set(TYPE_SECTIONS) <= set(get_args(ProviderType))


def test_default_type_is_openai_and_passes_through() -> None:
    policy = parse_policy(POLICY.format(extra=""))
    assert policy.providers["a"].type == "openai"
    rt = Runtime(policy)
    adapter = rt.snapshot.providers["a"].client.adapter
    assert adapter.type == "openai" and adapter.passthrough
    assert {"chat", "completions", "embeddings"} <= adapter.endpoints


def test_openai_session_headers_keep_todays_bearer_and_policy_headers() -> None:
    cfg = Provider(base_url="http://h/v1", headers={"x-org": "o"})
    assert make_adapter(cfg, "sk-1").session_headers() == {
        "content-type": "application/json",
        "authorization": "Bearer sk-1",
        "x-org": "o",
    }
    assert "authorization" not in make_adapter(cfg, None).session_headers()


def test_unknown_type_is_refused_with_its_path() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(POLICY.format(extra="type: opnai"))
    assert any(p.startswith("providers.a.type:") for p in e.value.problems)


def test_a_section_of_another_type_is_refused() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(POLICY.format(extra="azure: {surface: v1}"))
    assert any("providers.a" in p and "type openai" in p for p in e.value.problems)


def test_unsupported_endpoint_is_retryable_and_not_the_members_fault() -> None:
    f = UnsupportedEndpoint("anthropic", "embeddings")
    kind = failure_kind(f.kind)
    assert kind is FailureKind.UNSUPPORTED
    assert is_retryable(kind, bytes_sent_to_client=False)
    assert not counts_against_breaker(kind)
    rt = Runtime(parse_policy(POLICY.format(extra="")))
    p = rt.snapshot.providers["a"]
    assert p.breaker.acquire()
    attempt = Attempt(p, Context("r", 0.0), Admission())
    assert p.member.inflight == 1
    attempt.fail(f)
    assert p.breaker.allow() and p.member.inflight == 0 and p.member.failures == 0


AZURE = """
providers:
  az:
    type: azure
    base_url: {url}
    api_key_env: AZ_KEY
    models: {{chat: {deployment}}}
    {extra}
pools:
  main: {{members: [az]}}
models:
  chat: {{pool: main}}
"""


def _azure(
    url: str = "https://r.openai.azure.com", deployment: str = "gpt4o-prod", extra: str = ""
):
    return parse_policy(AZURE.format(url=url, deployment=deployment, extra=extra), env={})


def test_azure_deployment_urls_and_api_key_header() -> None:
    cfg = _azure().providers["az"]
    a = make_adapter(cfg, "k1")
    assert a.session_headers()["api-key"] == "k1"
    assert "authorization" not in a.session_headers()
    req = a.request("chat", {"model": "chat", "messages": []}, cfg.model_for("chat"), False)
    assert req.path == "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    assert b'"model":"gpt4o-prod"' in req.body
    assert a.request("embeddings", {"model": "chat", "input": "x"}, "e", False).path == (
        "/openai/deployments/e/embeddings?api-version=2024-10-21"
    )


def test_azure_v1_surface_with_bearer() -> None:
    cfg = _azure(extra="azure: {surface: v1, auth: bearer}").providers["az"]
    a = make_adapter(cfg, "tok")
    assert a.session_headers()["authorization"] == "Bearer tok"
    assert "api-key" not in a.session_headers()
    req = a.request("chat", {"model": "chat", "messages": []}, "gpt-4o", True)
    assert req.path == "/openai/v1/chat/completions"
    assert a.stream("chat", {}, "gpt-4o") is None  # OpenAI chunks already


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"url": "https://r.openai.azure.com/openai"}, "providers.az"),
        ({"deployment": "bad/name"}, "providers.az"),
        ({"extra": "azure: {api_version: yesterday}"}, "providers.az.azure.api_version"),
        ({"extra": "azure: {surface: classic}"}, "providers.az.azure.surface"),
    ],
)
def test_azure_fields_are_validated(kwargs: dict[str, str], where: str) -> None:
    with pytest.raises(PolicyError) as e:
        _azure(**kwargs)
    assert any(p.startswith(where) for p in e.value.problems), e.value.problems


def test_the_readme_policy_example_per_provider_type_is_valid() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Provider types", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    policy = parse_policy(example + "models:\n  chat: {pool: main}\n", env={})
    assert {p.type for p in policy.providers.values()} == {"openai", "azure", "anthropic"}
    assert policy.providers["claude"].anthropic.cache_prefix  # type: ignore[union-attr]


def test_the_provider_key_wins_over_a_policy_header_of_the_same_name() -> None:
    cfg = Provider(base_url="http://h/v1", headers={"Authorization": "Bearer old"})
    headers = make_adapter(cfg, "sk-new").session_headers()
    assert headers["authorization"] == "Bearer sk-new"


def test_the_transport_does_not_import_the_adapters() -> None:
    """Adapters build on the transport (OpenAIWire), never the other way round: no cycle."""
    import ast

    tree = ast.parse(
        (Path(__file__).resolve().parents[2] / "gateway" / "providers" / "upstream.py").read_text()
    )
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert not any(m.startswith("gateway.providers") for m in imported)
