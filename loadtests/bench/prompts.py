"""Synthetic chat requests with prompts of a chosen token length.

Prompts are made of common English words that are one token each in the cl100k/o200k encodings
(with their leading space), so ``n`` words is close to ``n`` prompt tokens on OpenAI-style
tokenizers; other tokenizers land within a few percent. A per-request nonce up front keeps exact
and prefix caches from turning a benchmark into a cache benchmark (``unique=False`` to allow hits).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import orjson

# fmt: off
_WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "was", "by", "it",
    "be", "at", "from", "this", "are", "or", "an", "have", "not", "which", "one", "all",
    "were", "when", "we", "there", "can", "their", "more", "has", "been", "would", "other",
    "time", "some", "what", "about", "out", "up", "into", "only", "new", "also", "two",
    "first", "way", "people", "could", "these", "may", "then", "over", "most", "like", "just",
    "use", "made", "work", "well", "day", "back", "after", "year", "good", "because",
    "through", "where", "any", "many", "between",
)
# fmt: on


@dataclass(frozen=True, slots=True)
class TokenDist:
    """Prompt length: fixed ``"100"``, uniform range ``"50-200"`` or choice ``"10,100,1000"``."""

    values: tuple[int, ...]
    uniform: bool

    @classmethod
    def parse(cls, spec: str | int) -> TokenDist:
        text = str(spec).strip()
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo < 1 or hi < lo:
                raise ValueError(f"bad token range {text!r}")
            return cls((lo, hi), uniform=True)
        values = tuple(int(x) for x in text.split(","))
        if any(v < 1 for v in values):
            raise ValueError(f"token counts must be >= 1: {text!r}")
        return cls(values, uniform=False)

    def sample(self, rng: random.Random) -> int:
        if self.uniform:
            return rng.randint(self.values[0], self.values[1])
        return self.values[0] if len(self.values) == 1 else rng.choice(self.values)


def make_prompt(tokens: int, rng: random.Random, unique: bool = True) -> str:
    """A prompt of about ``tokens`` tokens."""
    words = rng.choices(_WORDS, k=max(tokens - (3 if unique else 0), 1))
    head = f"{rng.randrange(10**6):06d} " if unique else ""
    return head + " ".join(words)


def chat_body(
    model: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    extra: dict[str, object] | None = None,
) -> bytes:
    """The JSON body of one chat completion; streams ask for usage in the last chunk."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if extra:
        body.update(extra)
    return orjson.dumps(body)


@dataclass(slots=True)
class RequestFactory:
    """Builds request bodies for one run from its token specs and seed."""

    model: str
    prompt_tokens: TokenDist
    max_tokens: int
    stream: bool
    seed: int = 0
    unique: bool = True
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def prompt(self, unique: bool | None = None) -> str:
        """A prompt drawn from the run's length distribution."""
        tokens = self.prompt_tokens.sample(self._rng)
        return make_prompt(tokens, self._rng, self.unique if unique is None else unique)

    def next(self, model: str | None = None) -> bytes:
        """The next body, for ``model`` (default: the run's model)."""
        tokens = self.prompt_tokens.sample(self._rng)
        prompt = make_prompt(tokens, self._rng, self.unique)
        return chat_body(model or self.model, prompt, self.max_tokens, self.stream)
