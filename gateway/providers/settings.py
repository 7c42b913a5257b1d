"""Per-type provider settings (plain pydantic data, imported by the policy schema).

A provider's `type:` picks its adapter (gateway.providers); the settings a type needs live in a
section named after it (`azure:`, `anthropic:`), checked against the type so that a section for
another type is refused instead of silently ignored.
"""

from __future__ import annotations

import datetime
import importlib.util
import re
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Every adapter type the gateway knows; each has an entry in gateway.providers' registry.
ProviderType = Literal["openai", "azure", "anthropic", "bedrock", "gemini"]


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

    @field_validator("api_version", mode="before")
    @classmethod
    def _unquoted_date(cls, v: object) -> object:
        # YAML reads an unquoted 2024-10-21 as a date.
        return v.isoformat() if isinstance(v, datetime.date) else v

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

    @field_validator("version", mode="before")
    @classmethod
    def _unquoted_date(cls, v: object) -> object:
        return v.isoformat() if isinstance(v, datetime.date) else v

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


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class BedrockSettings(_Strict):
    """Amazon Bedrock's Converse API, signed with SigV4 from credentials in the environment."""

    region: str | None = Field(
        None,
        pattern=r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+$",
        description="AWS region, e.g. us-east-1; when absent it is read from region_env.",
    )
    region_env: str = Field("AWS_REGION", description="Variable holding the region.")
    access_key_id_env: str = Field(
        "AWS_ACCESS_KEY_ID", description="Variable holding the access key id."
    )
    secret_access_key_env: str = Field(
        "AWS_SECRET_ACCESS_KEY", description="Variable holding the secret access key."
    )
    session_token_env: str | None = Field(
        "AWS_SESSION_TOKEN",
        description="Variable holding a session token (temporary credentials); unset or empty "
        "for long-term keys.",
    )
    cache_system_prompt: bool = Field(
        False,
        description="Add a cachePoint after the system prompt so that Bedrock's prompt cache "
        "serves repeated system prompts (models with prompt caching only).",
    )

    @field_validator(
        "region_env", "access_key_id_env", "secret_access_key_env", "session_token_env"
    )
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _ENV_NAME.match(v):
            raise ValueError(f"'{v}' is not an environment variable name")
        if v.startswith("GATEWAY_"):
            raise ValueError(
                f"'{v}': provider credentials may not be read from GATEWAY_* variables"
            )
        return v


_BEDROCK_HOST = re.compile(r"^bedrock-runtime(-fips)?\.([a-z0-9-]+)\.amazonaws\.com$")


def bedrock_problem(
    base_url: str, settings: BedrockSettings | None, api_key_env: str | None
) -> str | None:
    """Why a `type: bedrock` provider cannot work as configured (None: it can)."""
    if importlib.util.find_spec("botocore") is None:
        return (
            "type bedrock needs botocore, which is not installed: "
            "pip install 'llm-gateway[aws]' (or pip install botocore)"
        )
    parts = urlsplit(base_url)
    if parts.path.rstrip("/"):
        return (
            "base_url: for type bedrock give the runtime endpoint without a path "
            f"(https://bedrock-runtime.REGION.amazonaws.com), not '{parts.path}'"
        )
    if api_key_env is not None:
        return (
            "api_key_env: a bedrock provider signs with AWS credentials, named in "
            "bedrock.access_key_id_env / secret_access_key_env / session_token_env"
        )
    m = _BEDROCK_HOST.match(parts.hostname or "")
    region = settings.region if settings is not None else None
    if m and region and m.group(2) != region:
        # The signature's scope names the region: a mismatch is refused by AWS on every call.
        return f"bedrock.region '{region}' differs from the region of base_url ('{m.group(2)}')"
    return None


def bedrock_region(
    base_url: str, settings: BedrockSettings | None, env: Mapping[str, str]
) -> str | None:
    """The region to sign for: the policy's, else the endpoint host's, else region_env's."""
    settings = settings or BedrockSettings()
    if settings.region:
        return settings.region
    m = _BEDROCK_HOST.match(urlsplit(base_url).hostname or "")
    if m:
        return m.group(2)
    return env.get(settings.region_env) or None


class GeminiSettings(_Strict):
    """Google's Gemini API (generateContent / streamGenerateContent)."""

    api_version: Literal["v1beta", "v1"] = Field(
        "v1beta", description="The path's API version: {base_url}/{api_version}/models/{model}:..."
    )
