"""The routing policy as validated data.

A policy file (YAML) is parsed into `Policy`. Every model forbids unknown fields so that a typo in a
policy file is refused with the field's path instead of being silently ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.apis.response_store import StoredResponses
from gateway.cache.exact import ExactSettings
from gateway.cache.semantic_settings import SemanticRoute, SemanticSettings
from gateway.governance.settings import Governance
from gateway.infra.replicas import ReplicaSettings
from gateway.policy.crosscheck import reference_problems
from gateway.providers.settings import (
    AnthropicSettings,
    AzureSettings,
    BedrockSettings,
    GeminiSettings,
    ProviderType,
    bedrock_problem,
)
from gateway.resilience.admission import QueueSettings
from gateway.resilience.breaker import BreakerSettings
from gateway.resilience.hedge import HedgeSettings
from gateway.resilience.retry import MAX_DEADLINE_S, RetrySettings
from gateway.routing.affinity import AffinitySettings
from gateway.routing.balancer import BalancerSettings
from gateway.routing.class_rules import ClassRule
from gateway.wire.answer_checks import ResponseLimits

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/@+-]+$")]


# Validation context key: the loader runs the reference checks itself, on the plain document, so
# that they are reported even when a field failed validation (the model validator would not run).
SKIP_REFERENCES = "skip_references"
# An attempt may stream for a long time, but not for days: larger values overflow socket timeouts.
MAX_TIMEOUT_S = 86_400.0
MAX_SERVER_TIMEOUT_S = 3_600.0
MAX_PRICE = 1_000_000.0  # USD per 1M tokens


class Strict(BaseModel):
    # No inf/nan: `.inf` passes `gt=0` but overflows timers and cost arithmetic at run time.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Timeouts(Strict):
    """Per-attempt limits. Each expiry is a distinct failure kind."""

    connect_s: float = Field(2.0, gt=0, le=MAX_TIMEOUT_S, description="TCP/TLS connect.")
    first_byte_s: float = Field(
        30.0, gt=0, le=MAX_TIMEOUT_S, description="Until response headers / first stream chunk."
    )
    idle_s: float = Field(
        30.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Longest gap between two stream chunks; for a non-streamed answer, the time "
        "its body may take once the headers arrived (the upstream has the whole answer by then).",
    )
    total_s: float = Field(
        600.0, gt=0, le=MAX_TIMEOUT_S, description="Whole attempt, streams included."
    )
    unary_min_tps: float | None = Field(
        5.0,
        gt=0,
        description="Non-streamed answers come after the whole generation, so their headers are "
        "due within first_byte_s + max_tokens / this many tokens per second (a hang is then "
        "failed over in about that time, not total_s). Requests without max_tokens, or null "
        "here: total_s.",
    )

    @model_validator(mode="after")
    def _first_byte_within_total(self) -> Timeouts:
        # A first-byte limit given longer than the whole attempt can never fire: the policy is
        # inverted. Defaults above a short total_s are fine (the attempt's total caps them);
        # connect_s and idle_s above it are warnings of the policy check.
        if "first_byte_s" in self.model_fields_set and self.first_byte_s > self.total_s:
            raise ValueError(
                f"total_s ({self.total_s:g}) is shorter than first_byte_s "
                f"({self.first_byte_s:g}): that limit could never apply"
            )
        return self

    def unary_headers_s(self, max_tokens: int | None) -> float:
        """How long a non-streamed attempt may wait for the response headers."""
        if not max_tokens or self.unary_min_tps is None:
            return self.total_s
        return min(self.total_s, self.first_byte_s + max_tokens / self.unary_min_tps)


class Price(Strict):
    input_per_1m: float = Field(0.0, ge=0, le=MAX_PRICE)
    output_per_1m: float = Field(0.0, ge=0, le=MAX_PRICE)


class Provider(Strict):
    """One upstream (an endpoint or a deployment), spoken to through the adapter of its type."""

    type: ProviderType = Field(
        "openai",
        description="Wire format: openai (also vLLM, SGLang, llama.cpp, ...), azure, anthropic, "
        "bedrock, gemini.",
    )
    azure: AzureSettings | None = Field(None, description="Settings of `type: azure`.")
    bedrock: BedrockSettings | None = Field(None, description="Settings of `type: bedrock`.")
    anthropic: AnthropicSettings | None = Field(None, description="Settings of `type: anthropic`.")
    gemini: GeminiSettings | None = Field(None, description="Settings of `type: gemini`.")
    base_url: str = Field(pattern=r"^https?://", description="Ends with the API root, e.g. .../v1")
    api_key_env: str | None = Field(
        None, description="Name of the env var holding the provider key."
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Public alias -> the provider's own model id. '*' applies to any alias.",
    )
    max_inflight: int | None = Field(None, ge=1)
    weight: float = Field(1.0, gt=0)
    timeouts: Timeouts = Timeouts()
    price: Price = Price()
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra headers sent upstream."
    )
    simulated: bool = Field(
        False, description="True for the built-in simulator (shown in /v1/models)."
    )
    breaker: BreakerSettings = BreakerSettings()
    limits: ResponseLimits = Field(
        default_factory=ResponseLimits,
        description="Size bounds on this provider's answers (decompressed bytes).",
    )
    forward_ratelimit_headers: bool = Field(
        False,
        description="Pass this provider's x-ratelimit-* response headers on to clients (no other "
        "upstream header ever reaches a client).",
    )

    @field_validator("base_url")
    @classmethod
    def _usable_url(cls, v: str) -> str:
        # A URL no request can reach (often from an interpolated variable) is refused here,
        # before traffic, rather than failing every request as a connect_error.
        bad = next((c for c in v if ord(c) <= 32 or 127 <= ord(c) <= 159), None)
        if bad is not None:
            raise ValueError(f"holds a space or control character ({bad!r})")
        # Credentials in a URL end up in logs and error messages; keys go in api_key_env/headers.
        parts = urlsplit(v)
        if parts.username or parts.password:
            raise ValueError(
                "must not carry credentials (user:password@); put the key in api_key_env or headers"
            )
        if not parts.hostname:
            raise ValueError("has no host name")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError(f"the port of '{parts.netloc}' is not a port number (1-65535)")
        if "#" in v:
            # Request paths are appended to the base URL: after a '#' they would never be sent.
            raise ValueError("must not have a #fragment (request paths are appended after it)")
        return v

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not HEADER_NAME.match(name):
                raise ValueError(f"'{name}' is not a valid header name")
            if any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in value):
                raise ValueError(
                    f"the value of '{name}' holds a control character (e.g. a newline)"
                )
        return v

    @field_validator("api_key_env")
    @classmethod
    def _not_a_gateway_variable(cls, v: str | None) -> str | None:
        if v is not None and not ENV_NAME.match(v):
            raise ValueError(f"'{v}' is not an environment variable name")
        if v is not None and v.upper().startswith(GATEWAY_ENV_PREFIX):
            # The gateway's own secrets (admin key, tenant keys) must never be sent upstream.
            raise ValueError(f"'{v}': provider keys may not be read from GATEWAY_* variables")
        return v

    @model_validator(mode="after")
    def _sections_match_type(self) -> Provider:
        # A section for another type is a typo or a half-edited provider: refuse it.
        for section in TYPE_SECTIONS:
            if section != self.type and getattr(self, section) is not None:
                raise ValueError(f"'{section}:' settings given for a provider of type {self.type}")
        if self.type == "gemini" and urlsplit(self.base_url).path.rstrip("/"):
            raise ValueError(
                "base_url: for type gemini give the API root without a path "
                "(https://generativelanguage.googleapis.com): the adapter adds /v1beta/models/..."
            )
        if self.type == "bedrock":
            problem = bedrock_problem(self.base_url, self.bedrock, self.api_key_env)
            if problem:
                raise ValueError(problem)
        if self.type == "anthropic" and urlsplit(self.base_url).path.rstrip("/").endswith("/v1"):
            raise ValueError(
                "base_url: for type anthropic give the API root without /v1 "
                "(https://api.anthropic.com): the adapter appends /v1/messages"
            )
        if self.type == "azure":
            path = urlsplit(self.base_url).path.rstrip("/")
            if path:
                raise ValueError(
                    f"base_url: for type azure give the resource endpoint without a path "
                    f"(https://NAME.openai.azure.com), not '{path}': the adapter builds the path"
                )
            for alias, deployment in self.models.items():
                if not AZURE_DEPLOYMENT.match(deployment):
                    raise ValueError(
                        f"models.{alias}: '{deployment}' is not an Azure deployment name"
                    )
        return self

    def model_for(self, alias: str) -> str:
        return self.models.get(alias) or self.models.get("*") or alias


class Pool(Strict):
    members: list[Name] = Field(min_length=1)
    balancer: BalancerSettings = BalancerSettings()
    affinity: AffinitySettings = AffinitySettings(enabled=False)
    latency_signal: Literal["ttft", "per_token", "total"] = Field(
        "ttft",
        description="What the latency estimate measures: time to first token (interactive), "
        "time per output token (long generations) or total time.",
    )
    fallback: list[Name] = Field(default_factory=list, description="Pools tried next, in order.")
    max_attempts: int = Field(3, ge=1, le=10, description="Upstream attempts in this pool.")
    queue: QueueSettings = QueueSettings()
    hedge: HedgeSettings = Field(
        default_factory=HedgeSettings,
        description="Hedged requests (off by default): a second member when the first is slow.",
    )

    @field_validator("members", "fallback")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        # A member listed twice would get twice the traffic behind the balancer's back.
        repeated = sorted({name for name in v if v.count(name) > 1})
        if repeated:
            raise ValueError(f"listed more than once: {', '.join(repeated)}")
        return v


class CachePolicy(Strict):
    exact: ExactSettings = ExactSettings()
    semantic: SemanticRoute = SemanticRoute()


class Alias(Strict):
    """A public model name clients send as `model`."""

    pool: Name = Field(description="Pool used when no class route matches.")
    routes: dict[Name, Name] = Field(default_factory=dict, description="Request class -> pool.")
    default_max_tokens: int = Field(
        256, ge=1, description="Expected output when the request says none."
    )
    context_window: int | None = Field(None, ge=1)
    fallback_alias: Name | None = Field(
        None, description="Alias used when the prompt exceeds the window."
    )
    encoding: str | None = Field(None, description="tiktoken encoding; default by model family.")
    owned_by: str = "llm-gateway"
    cache: CachePolicy = CachePolicy()
    resume: bool = Field(
        False,
        description="Resume a stream that breaks mid-way on another member, spliced into the same "
        "client stream (the upstream must continue a trailing assistant message).",
    )
    response_model: Literal["alias", "provider"] = Field(
        "alias",
        description="The `model` named in answers: the alias the client asked for, or the "
        "provider's own model id.",
    )
    deadline_s: float | None = Field(
        None,
        gt=0,
        le=MAX_DEADLINE_S,
        allow_inf_nan=False,
        description="This model's own request deadline (an interactive model's shorter than "
        "a batch model's): the shorter of it and retry.deadline_s applies, and clients may "
        "still shorten it (x-gateway-timeout). Null: retry.deadline_s alone.",
    )


class ApiKey(Strict):
    """A gateway key. The plaintext never appears in the policy."""

    tenant: Name
    key_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    key_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ApiKey:
        if (self.key_sha256 is None) == (self.key_env is None):
            raise ValueError("give exactly one of key_sha256 or key_env")
        return self


class Auth(Strict):
    keys: list[ApiKey] = Field(default_factory=list)


class Server(Strict):
    """Limits on what clients may send and hold (per worker process)."""

    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=MAX_SERVER_TIMEOUT_S,
        description="A request's headers must arrive within this (else 408 / close).",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=MAX_SERVER_TIMEOUT_S,
        description="A request's body must arrive within this after its headers.",
    )
    keepalive_timeout_s: float = Field(
        5.0,
        gt=0,
        le=MAX_SERVER_TIMEOUT_S,
        description="An idle keep-alive connection is closed after this.",
    )
    max_connections: int = Field(
        4096,
        ge=8,
        description="Open client connections per worker (also at most half the open-file "
        "limit); beyond it the longest-idle connections are closed first.",
    )
    max_n: int = Field(8, ge=1, le=128, description="Largest `n` (and `best_of`) accepted.")
    max_json_depth: int = Field(
        64, ge=4, le=200, description="Deepest nesting of arrays/objects in a request body."
    )


class Metrics(Strict):
    public: bool = Field(
        False,
        description="Serve /metrics and the detailed /ready to anyone; off = admin key or loopback.",
    )


class Degradation(Strict):
    rules: str | None = Field(
        None,
        min_length=1,
        max_length=4096,  # PATH_MAX: a longer path fails in the OS, not in the check
        pattern=r"^[^\x00]+$",
        description="Folder (or file) of degradation rules, relative to the policy file.",
    )


class Policy(Strict):
    version: Literal[1] = Field(1, description="The policy format; 1 is the only one.")
    # Values the loader took from environment variables: not a field (a file cannot set it).
    _interpolated: tuple[str, ...] = PrivateAttr(default=())
    server: Server = Server()
    responses: StoredResponses = Field(
        default_factory=StoredResponses,
        description="Stored answers of the Responses API (GET /v1/responses/{id}, "
        "previous_response_id).",
    )
    metrics: Metrics = Metrics()
    auth: Auth = Auth()
    provider_key_env_prefixes: list[str] = Field(
        default_factory=list,
        description="Allowed name prefixes of providers' api_key_env (and of variables used in "
        "their headers); empty = any name except GATEWAY_*.",
    )
    classes: list[ClassRule] = Field(default_factory=list, description="First match wins.")
    default_class: Name = "default"
    retry: RetrySettings = RetrySettings(max_attempts=4)
    degradation: Degradation = Degradation()
    semantic_cache: SemanticSettings = Field(
        default_factory=SemanticSettings,
        description="The semantic cache engine, started when an alias enables cache.semantic.",
    )
    replicas: ReplicaSettings = ReplicaSettings()
    governance: Governance = Field(
        default_factory=Governance,
        description="Limits, budgets and spend per tenant and key (gateway/governance).",
    )
    providers: dict[Name, Provider] = Field(min_length=1)
    pools: dict[Name, Pool] = Field(min_length=1)
    models: dict[Name, Alias] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> Policy:
        if info.context and info.context.get(SKIP_REFERENCES):
            return self
        errors = [
            f"{p.path}: {p.message}"
            for p in reference_problems(self.model_dump(exclude_unset=True))
            if not p.warning
        ]
        if errors:
            raise ValueError("; ".join(errors))
        return self


# Provider fields holding the settings of one type (named after it).
TYPE_SECTIONS = ("azure", "anthropic", "bedrock", "gemini")
AZURE_DEPLOYMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GATEWAY_ENV_PREFIX = "GATEWAY_"
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
