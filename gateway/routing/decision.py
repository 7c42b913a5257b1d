"""Classify: estimate tokens, pick the request class, check the context window, derive the pools.

Pure and cheap: also used by the explain endpoint and command, which show a decision without
sending anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.policy.schema import Alias, Policy
from gateway.routing.affinity import prefix_key
from gateway.routing.class_rules import RequestFeatures, classify
from gateway.wire.request import ParsedRequest
from gateway.wire.tokens import encoding_for_model, estimate_prompt

PRIORITY_HEADER = "x-gateway-priority"
MAX_ALIAS_HOPS = 4


def pool_chain(policy: Policy, alias: Alias, request_class: str) -> list[str]:
    """The class's pool first, then each pool's fallbacks breadth-first, without repeats."""
    first = alias.routes.get(request_class, alias.pool)
    chain = [first]
    i = 0
    while i < len(chain):
        for fb in policy.pools[chain[i]].fallback:
            if fb not in chain:
                chain.append(fb)
        i += 1
    return chain


@dataclass(slots=True)
class Decision:
    alias_name: str
    alias: Alias
    prompt_tokens: int
    expected_output_tokens: int
    request_class: str
    chain: list[str]
    prefix_key: bytes | None
    rerouted_from: str | None = None


def _fits(alias: Alias, prompt_tokens: int, output_tokens: int) -> bool:
    return alias.context_window is None or prompt_tokens + output_tokens <= alias.context_window


def decide(policy: Policy, acc: ParsedRequest, tenant: str, priority: str | None) -> Decision:
    """The routing decision for an accepted request (raises GatewayError when nothing fits)."""
    name = acc.model
    alias = policy.models[name]
    original = name
    encoding = alias.encoding or encoding_for_model(name)
    prompt_tokens = estimate_prompt(acc.body, encoding)
    # A prompt too long for the alias's window goes to its longer-context alias before it is sent.
    for _ in range(MAX_ALIAS_HOPS):
        expected = acc.max_tokens or alias.default_max_tokens
        if _fits(alias, prompt_tokens, acc.max_tokens or 0) or alias.fallback_alias is None:
            break
        name = alias.fallback_alias
        alias = policy.models[name]
    expected = acc.max_tokens or alias.default_max_tokens
    if not _fits(alias, prompt_tokens, acc.max_tokens or 0):
        assert alias.context_window is not None
        raise errors.bad_request(
            f"This model's maximum context length is {alias.context_window} tokens. However, your "
            f"request has about {prompt_tokens} prompt tokens"
            + (f" and asks for {acc.max_tokens} completion tokens" if acc.max_tokens else "")
            + ". Please reduce the length of the messages or completion.",
            param="messages",
            code="context_length_exceeded",
        )
    features = RequestFeatures(prompt_tokens, expected, original, priority, tenant)
    request_class = classify(features, policy.classes, policy.default_class)
    chain = pool_chain(policy, alias, request_class)
    key = None
    if acc.endpoint != "embeddings":
        # The first pool of the chain that keeps prefixes together sets how the key is cut.
        for pool in chain:
            affinity = policy.pools[pool].affinity
            if affinity.enabled:
                key = prefix_key(acc.body, affinity)
                break
    return Decision(
        name,
        alias,
        prompt_tokens,
        expected,
        request_class,
        chain,
        key,
        original if name != original else None,
    )
