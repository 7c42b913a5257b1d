"""The `model` clients read in answers: the alias they asked for (default) or the provider's id.

A client that asked for `demo` expects `demo` back, whichever member answered (OpenAI answers with
the model asked for, or a dated snapshot of it). The policy may keep the provider's own id
(`response_model: provider` on the alias), e.g. to see which deployment answered.

The rewrite is a byte splice of the first `"model": "..."` member of a body or stream event (the
top-level one: OpenAI-shaped answers have no other unescaped `"model"` key), without a parse;
an event that already names the alias is left as it is.
"""

from __future__ import annotations

import re

import orjson

_MODEL = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')


class ModelName:
    """Rewrites the `model` member of answers to one name (one instance per request: it
    remembers the member the provider wrote, so later events of a stream cost one replace)."""

    __slots__ = ("_member", "_same", "_seen")

    def __init__(self, name: str) -> None:
        value = orjson.dumps(name)
        self._member = b'"model":' + value
        self._same = (self._member, b'"model": ' + value)
        self._seen: bytes | None = None

    def __call__(self, data: bytes) -> bytes:
        if self._seen is not None:
            out = data.replace(self._seen, self._member, 1)
            if out is not data:
                return out
        if self._same[0] in data or self._same[1] in data:
            return data
        m = _MODEL.search(data)
        if m is None or (m.start() and data[m.start() - 1] == 0x5C):  # an escaped quote: text
            return data
        self._seen = m.group()
        return data[: m.start()] + self._member + data[m.end() :]

    def block(self, data: bytes, n: int) -> bytes | None:
        """A block of ``n`` chunk events rewritten at once, when each names the model as the last
        event seen did (or already names the alias); None: rewrite them one by one."""
        seen, member = self._seen, self._member
        if seen is not None:
            if len(seen) != len(member):  # one pass: the length change counts the replacements
                out = data.replace(seen, member)
                if len(out) - len(data) == n * (len(member) - len(seen)):
                    return out
            elif data.count(seen) == n:
                return data.replace(seen, member)
        if data.count(member) == n:
            return data
        return None


def for_alias(mode: str, alias: str) -> ModelName | None:
    """The rewrite for an alias's `response_model` setting (None: answers are left as they are)."""
    return ModelName(alias) if mode == "alias" else None
