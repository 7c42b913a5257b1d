"""Deterministic text: prompt rendering, token counting, generated words, embeddings.

Tokenizer choice: a prompt costs ``ceil(len(rendered) / 4)`` tokens, where ``rendered`` is the chat
rendered as ``<|role|>content\\n`` per message (the role markers stand for a chat template's
overhead). Four characters per token is what English averages under BPE tokenizers; it needs no
vocabulary, costs O(1) per message and is the same on every run. Generated text is one word per
token, so usage counts equal the number of words (chunks) emitted.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any

import orjson

CHARS_PER_TOKEN = 4

_WORDS = """
the of and to in is that it for on with as was by at be this from or an are not have which
one all were but when there can more their if will about up out so them into time some
could these two may then first any like other than only its new over also after use way
many most well back even such through where much before right because good each those
people state very must both while under never same another know three system model request
token stream batch cache prefix route pool queue server client answer question value
signal result method simple quick light steady clear open close early late small large
fast slow north south river stone paper window garden bridge market winter summer morning
evening number letter story music harbor table water
"""
VOCAB: tuple[str, ...] = tuple(_WORDS.split())
VOCAB_SIZE = len(VOCAB)
# JSON-encoded words, ready to splice into response bytes: first token without a leading space.
WORD_JSON_FIRST: tuple[bytes, ...] = tuple(orjson.dumps(w) for w in VOCAB)
WORD_JSON_NEXT: tuple[bytes, ...] = tuple(orjson.dumps(" " + w) for w in VOCAB)


def content_text(content: Any) -> str:
    """Text of a message ``content``: a string, a list of parts, or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                t = p.get("text")
                if isinstance(t, str):
                    parts.append(t)
            elif isinstance(p, str):
                parts.append(p)
        return "".join(parts)
    return "" if content is None else str(content)


def render_messages(messages: list[dict[str, Any]]) -> str:
    """One string standing for what a chat template would feed the model."""
    out = []
    for m in messages:
        text = content_text(m.get("content"))
        calls = m.get("tool_calls")
        if calls:
            text += orjson.dumps(calls).decode()
        out.append(f"<|{m.get('role', 'user')}|>{text}\n")
    return "".join(out)


def count_tokens(text: str) -> int:
    """Prompt tokens of ``text`` under the 4-characters-per-token rule."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def text_seed(prompt: str, seed: int | None = None) -> int:
    """A stable 64-bit seed from the prompt and, when given, the request ``seed``."""
    h = hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=8)
    if seed is not None:
        h.update(b"\x00seed=" + str(seed).encode())
    return int.from_bytes(h.digest(), "little")


def word_ids(seed: int, start: int, count: int) -> list[int]:
    """Vocabulary indices ``start .. start+count`` of the word sequence for ``seed``.

    The sequence is prefix-stable: ids for (0, n) are a prefix of ids for (0, n + m), which is
    what makes a continuation request reproduce the rest of an unbroken answer.
    """
    rnd = random.Random(seed).random
    ids = [int(rnd() * VOCAB_SIZE) for _ in range(start + count)]
    return ids[start:]


def natural_length(seed: int, mean: int, sigma: float, max_output: int) -> int:
    """Output length when the request sets none: lognormal around ``mean``, from its own RNG."""
    if sigma <= 0:
        return max(1, min(mean, max_output))
    rng = random.Random(seed ^ 0x5EED5EED5EED)
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, min(int(rng.lognormvariate(mu, sigma)), max_output))


def join_words(ids: list[int], first: bool) -> str:
    """Text of ``ids``; ``first`` = the answer starts here, so no leading space."""
    text = " ".join(VOCAB[i] for i in ids)
    return text if first or not text else " " + text


def count_words(text: str) -> int:
    """Tokens already present in a partial answer (one word = one token)."""
    return len(text.split())


def embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector from a hash of ``text``."""
    rng = random.Random(text_seed(text))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]
