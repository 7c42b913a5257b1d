"""Prefix affinity: send requests that share a prompt prefix to the same member.

Inference servers keep the KV cache of recent prompts; a request whose prefix
is already cached on a member skips most of its prefill there. The prefix key
is a chain of hashes over fixed-size character blocks (like llm-d's 64-char
blocks) of the prompt's leading part: the system/developer messages and the
first user turn. Later turns are left out on purpose, so every turn of one
conversation gets the same key and stays on the member that holds its cache.

Members are ranked by rendezvous (highest random weight) hashing: removing a
member moves only the keys it owned. Bounded load (consistent hashing with
bounded loads, Mirrokni et al.) keeps one hot prefix from melting a member:
a member may take the request only while its in-flight count after placement
stays within `cap = ceil((1 + epsilon) * (total_in_flight + 1) / n)`, i.e.
within `(1 + epsilon)` x the mean load (rounded up, and never below 2); otherwise the
next member in the key's rendezvous order is tried (always the same one for
a given key, so the spill-over member warms the same prefix).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.routing.balancer import Eligible, always_eligible, candidates
from gateway.routing.member import Member

_DIGEST = 8
_TWO64 = float(1 << 64)


class AffinitySettings(BaseModel):
    """Prefix affinity parameters of a pool."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    block_chars: int = Field(default=64, ge=8, le=65_536)
    max_blocks: int = Field(default=16, ge=1, le=1024)
    epsilon: float = Field(default=0.25, ge=0.0, description="allowed load above the mean")


def block_hashes(text: str, block_chars: int = 64, max_blocks: int = 16) -> list[bytes]:
    """Chained 8-byte hashes of `text` cut into blocks (a short last block included).

    Hash i covers blocks 0..i, so two texts share hash i exactly when they
    share their first i + 1 blocks.
    """
    out: list[bytes] = []
    prev = b""
    end = min(len(text), block_chars * max_blocks)
    for start in range(0, end, block_chars):
        block = text[start : min(start + block_chars, end)].encode("utf-8", "surrogatepass")
        prev = blake2b(prev + block, digest_size=_DIGEST).digest()
        out.append(prev)
    return out


def _content_prefix(content: Any, room: int) -> str:
    if isinstance(content, str):
        return content[:room]
    if not isinstance(content, Sequence):
        return ""
    pieces: list[str] = []
    used = 0
    for part in content:
        if used >= room:
            break
        if isinstance(part, Mapping):
            text = part.get("text")
            if not isinstance(text, str):
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                text = f"\x1d{part.get('type')}:{url if isinstance(url, str) else ''}"
        elif isinstance(part, str):
            text = part
        else:
            continue
        text = text[: room - used]
        pieces.append(text)
        used += len(text)
    return "".join(pieces)


# A system prompt at least this long is the affinity key on its own.
MIN_SHARED_CHARS = 256


def _is_user(messages: Sequence[Any], i: int) -> bool:
    return (
        i < len(messages) and isinstance(messages[i], Mapping) and messages[i].get("role") == "user"
    )


def leading_text(body: Mapping[str, Any], cap: int) -> str:
    """The leading part of a request's prompt, at most `cap` characters."""
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        pieces: list[str] = []
        used = 0
        for i, msg in enumerate(messages):
            if used >= cap or not isinstance(msg, Mapping):
                break
            role = str(msg.get("role", ""))
            piece = f"{role}\x1f{_content_prefix(msg.get('content'), cap)}\x1e"[: cap - used]
            pieces.append(piece)
            used += len(piece)
            if (
                role in ("system", "developer")
                and used >= MIN_SHARED_CHARS
                and _is_user(messages, i + 1)
            ):
                # A real shared system prompt: key on it alone, so requests that share it but ask
                # different questions land together (that prefix is what the KV cache reuses).
                break
            if role == "user":
                break  # system/developer messages and the first user turn only
        return "".join(pieces)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            prompt = first
        else:  # token ids, or a batch of token id lists
            ids = prompt if isinstance(first, int) else first
            # Never raise on a shape the request check missed (a caller without it): no key.
            if not isinstance(ids, list):
                return ""
            prompt = ",".join(str(t) for t in ids[: cap // 2] if type(t) is int)
    return prompt[:cap] if isinstance(prompt, str) else ""


def prefix_key(body: Mapping[str, Any], settings: AffinitySettings | None = None) -> bytes | None:
    """Affinity key of a request: the chained hash of its deepest leading block.

    None when affinity is off or the request has no prompt text.
    """
    s = settings or _DEFAULT_SETTINGS
    if not s.enabled:
        return None
    text = leading_text(body, s.block_chars * s.max_blocks)
    if not text:
        return None
    return block_hashes(text, s.block_chars, s.max_blocks)[-1]


def _score(key: bytes, member: Member) -> float:
    """Weighted rendezvous score: weight / -ln(u), u uniform in (0, 1) per (key, member)."""
    h = blake2b(key + member.name.encode(), digest_size=_DIGEST).digest()
    u = (int.from_bytes(h, "big") + 0.5) / _TWO64
    return member.weight / -math.log(u)


def affinity_order(key: bytes, members: Sequence[Member]) -> list[Member]:
    """Members in the key's rendezvous order (preferred first)."""
    return sorted(members, key=lambda m: _score(key, m), reverse=True)


def pick_affine(
    key: bytes | None,
    members: Sequence[Member],
    eligible: Eligible = always_eligible,
    settings: AffinitySettings | None = None,
) -> Member | None:
    """The member that owns `key`, or the next one in its order if that one is overloaded.

    Returns None when there is no key, affinity is off or no member qualifies
    (the caller then falls back to its balancer).
    """
    s = settings or _DEFAULT_SETTINGS
    if key is None or not s.enabled:
        return None
    pool = candidates(members, eligible)
    if not pool:
        return None
    total = sum(m.inflight for m in pool)
    # Below two in flight there is nothing to balance: a member busy with one request keeps its
    # prefixes (else at low load every second request of a prefix would go elsewhere).
    cap = max(2, math.ceil((1.0 + s.epsilon) * (total + 1) / len(pool)))
    ranked = affinity_order(key, pool)
    for m in ranked:
        if m.inflight < cap:  # its load after placement stays within the cap
            return m
    return min(ranked, key=lambda m: m.inflight)  # unreachable: the least loaded fits


_DEFAULT_SETTINGS = AffinitySettings()
