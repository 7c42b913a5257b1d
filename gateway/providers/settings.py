"""Per-type provider settings (plain pydantic data, imported by the policy schema).

A provider's `type:` picks its adapter (gateway.providers); the settings a type needs live in a
section named after it (`azure:`, `anthropic:`), checked against the type so that a section for
another type is refused instead of silently ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Every adapter type the gateway knows; each has an entry in gateway.providers' registry.
ProviderType = Literal["openai", "azure"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AzureSettings(_Strict):
    """Azure OpenAI: classic deployment URLs or the v1 surface."""

    surface: Literal["deployments", "v1"] = Field(
        "deployments",
        description="'deployments': {base_url}/openai/deployments/{deployment}/chat/completions"
        "?api-version=...; the deployment is the member's model mapping. 'v1': "
        "{base_url}/openai/v1/chat/completions with the model in the body.",
    )
    api_version: str = Field(
        "2024-10-21",
        pattern=r"^(\d{4}-\d{2}-\d{2}(-preview)?|v1|latest|preview)$",
        description="The api-version query parameter (deployments surface).",
    )
    auth: Literal["api-key", "bearer"] = Field(
        "api-key",
        description="How the key is sent: the `api-key` header, or `Authorization: Bearer` "
        "(an Entra ID token, v1 surface).",
    )


class AnthropicSettings(_Strict):
    """Anthropic's native Messages API."""

    version: str = Field(
        "2023-06-01", pattern=r"^\d{4}-\d{2}-\d{2}$", description="The anthropic-version header."
    )
    max_tokens: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="Sent when the request gives no max_tokens (Anthropic requires one).",
    )
    cache_prefix: bool = Field(
        False,
        description="Mark the shared prefix (tools, system prompt, the first user turn) with "
        "cache_control so that Anthropic's prompt cache serves repeated prefixes.",
    )
    beta: list[str] = Field(
        default_factory=list, description="Values of the anthropic-beta header, if any."
    )
