"""What the simulated model says when a request asks for more than plain text.

``n`` choices, structured output (``response_format``), tool calls (``tool_choice`` forced,
``auto``, ``none``), ``logprobs`` / ``top_logprobs``, and ``stop`` sequences. A request with none
of these gets no plan and keeps the precomputed fast path (``responses.ChatFormat.words``).

Every choice is a list of tokens (text pieces) and, for a tool call, the call whose arguments
the tokens spell. The same request (prompt and ``seed``) gives the same plan.

Tool choice under ``auto``: the model calls a tool when the last message is the user's and it
names the tool (``get_weather``) or a distinctive word of the tool's name (``weather``), and
answers in text otherwise (always after a tool result, so an agent loop ends); one call per tool
named, unless ``parallel_tool_calls`` is false.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from .schema_values import value_for
from .text import VOCAB, content_text, word_ids

# Request fields that need a plan (any other field keeps the fast path).
PLAN_FIELDS = ("n", "response_format", "tools", "logprobs", "stop", "top_logprobs", "echo")
_PIECE = re.compile(r"\s?\w+|\s?[^\w\s]+|\s+")
_NAME_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
# Words of a tool's name too generic to mean the user asked for that tool.
_GENERIC = frozenset(
    [
        "get",
        "set",
        "list",
        "create",
        "update",
        "delete",
        "remove",
        "fetch",
        "find",
        "make",
        "call",
        "tool",
        "func",
        "function",
        "data",
        "info",
        "value",
        "query",
        "run",
        "execute",
        "send",
        "read",
        "write",
        "add",
        "new",
        "the",
        "for",
    ]
)


@dataclass(slots=True)
class Choice:
    index: int
    pieces: list[str]  # the tokens, in order (a tool call: pieces of its arguments)
    finish: str
    # Tool calls ({"id","type","function":{"name","arguments"}}): the pieces spell their
    # arguments one after the other; piece_call[j] = the call piece j belongs to.
    calls: list[dict[str, Any]] = field(default_factory=list)
    piece_call: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[str, float]]]] | None = None  # per piece
    echo: str = ""  # legacy completions with `echo`: the prompt, before the generated text

    @property
    def text(self) -> str:
        return self.echo + "".join(self.pieces)


@dataclass(slots=True)
class Plan:
    choices: list[Choice]
    top_logprobs: int = 0
    logprobs: bool = False
    tokens: int = field(init=False, default=0)  # completion tokens, all choices

    def __post_init__(self) -> None:
        self.tokens = sum(len(c.pieces) for c in self.choices)

    @property
    def longest(self) -> int:
        return max(len(c.pieces) for c in self.choices)


def needs_plan(body: dict[str, Any]) -> bool:
    for name in PLAN_FIELDS:
        v = body.get(name)
        if v is None or v is False:
            continue
        if name == "n" and v == 1:
            continue
        if name == "response_format" and isinstance(v, dict) and v.get("type") == "text":
            continue
        return True
    return False


def pieces_of(text: str) -> list[str]:
    """Tokens of a generated text: words, punctuation runs and spaces (about 3 chars each)."""
    return _PIECE.findall(text)


def word_pieces(ids: list[int], first: bool) -> list[str]:
    out = []
    for i in ids:
        out.append(VOCAB[i] if first else " " + VOCAB[i])
        first = False
    return out


def choice_seed(seed: int, index: int) -> int:
    return seed if index == 0 else (seed * 0x9E3779B97F4A7C15 + index) & 0xFFFFFFFFFFFFFFFF


# -- tools ------------------------------------------------------------------------------------


def _functions(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        return []
    return [
        t["function"]
        for t in tools
        if isinstance(t, dict)
        and t.get("type", "function") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]


def _asked_for(fns: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools the last (user) message asks for, by name or a distinctive word of the name."""
    last = messages[-1] if messages else {}
    if last.get("role") != "user":
        return []
    said = content_text(last.get("content")).lower()
    words = set(re.findall(r"[a-z0-9]+", said))
    asked = []
    for fn in fns:
        name = fn["name"]
        parts = {p.lower() for p in _NAME_PARTS.findall(name)}
        if name.lower() in said or any(
            len(p) >= 4 and p not in _GENERIC and p in words for p in parts
        ):
            asked.append(fn)
    return asked


def tools_to_call(body: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The functions the model calls for this request (none: a text answer).

    Several when the message asks for several and `parallel_tool_calls` is not false.
    """
    fns = _functions(body.get("tools"))
    if not fns:
        return []
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        if choice.get("type") == "allowed_tools":
            allowed = choice.get("allowed_tools") or {}
            names = {
                (t.get("function") or {}).get("name")
                for t in allowed.get("tools") or []
                if isinstance(t, dict)
            }
            fns = [f for f in fns if f["name"] in names]
            choice = allowed.get("mode", "auto")
        else:
            name = (choice.get("function") or {}).get("name")
            return [f for f in fns if f["name"] == name][:1]
    if choice == "none" or not fns:
        return []
    asked = _asked_for(fns, messages)
    if choice == "required" and not asked:
        asked = fns[:1]
    return asked if body.get("parallel_tool_calls") is not False else asked[:1]


def tool_call(fn: dict[str, Any], seed: int, call_id: str) -> dict[str, Any]:
    """A call whose arguments validate against the function's ``parameters`` schema."""
    params = fn.get("parameters")
    args = value_for(params, random.Random(seed)) if isinstance(params, dict) else {}
    if not isinstance(args, dict):
        args = {}
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": fn["name"], "arguments": orjson.dumps(args).decode()},
    }


# -- structured output ----------------------------------------------------------------------------


def structured_text(response_format: Any, seed: int) -> str | None:
    """The JSON text a ``response_format`` asks for, or None for free text."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    rng = random.Random(seed)
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return orjson.dumps(value_for(schema if isinstance(schema, dict) else {}, rng)).decode()
    if kind == "json_object":
        keys = ("answer", "summary", "topic")
        return orjson.dumps({k: f"{VOCAB[rng.randrange(len(VOCAB))]}" for k in keys}).decode()
    return None


# -- stop sequences and logprobs ----------------------------------------------------------------


def apply_stop(pieces: list[str], stop: Any) -> list[str] | None:
    """The pieces cut before the earliest stop sequence, or None when none occurs."""
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    stops = [s for s in stops if isinstance(s, str) and s]
    if not stops:
        return None
    text = "".join(pieces)
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    if not found:
        return None
    cut = min(found)
    out, pos = [], 0
    for p in pieces:
        if pos + len(p) <= cut:
            out.append(p)
        elif pos < cut:
            out.append(p[: cut - pos])
        pos += len(p)
    return out


def logprobs_for(
    pieces: list[str], seed: int, top: int
) -> list[tuple[float, list[tuple[str, float]]]]:
    """Per piece: its logprob and the ``top`` most likely alternatives (itself first)."""
    rng = random.Random(seed ^ 0x10C9)
    out = []
    for p in pieces:
        lp = -round(rng.expovariate(4.0), 4)
        alts: list[tuple[str, float]] = [(p, lp)] if top else []
        lead = " " if p.startswith(" ") else ""
        below = lp
        while len(alts) < top:
            below -= round(0.5 + rng.expovariate(1.0), 4)
            word = lead + VOCAB[rng.randrange(len(VOCAB))]
            if word != p and all(word != a for a, _ in alts):
                alts.append((word, round(below, 4)))
        out.append((lp, alts))
    return out


def chat_logprobs(
    entries: list[tuple[float, list[tuple[str, float]]]], pieces: list[str]
) -> list[dict[str, Any]]:
    """OpenAI's ``choices[].logprobs.content`` items."""
    return [
        {
            "token": p,
            "logprob": lp,
            "bytes": list(p.encode()),
            "top_logprobs": [
                {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts
            ],
        }
        for p, (lp, alts) in zip(pieces, entries, strict=True)
    ]


def completion_logprobs(
    entries: list[tuple[float, list[tuple[str, float]]]], pieces: list[str], offset: int
) -> dict[str, Any]:
    """The legacy completions' ``choices[].logprobs`` object."""
    offsets = []
    for p in pieces:
        offsets.append(offset)
        offset += len(p)
    return {
        "tokens": list(pieces),
        "token_logprobs": [lp for lp, _ in entries],
        "top_logprobs": [dict(alts) for _, alts in entries],
        "text_offset": offsets,
    }


# -- the plan ---------------------------------------------------------------------------------


def chat_plan(
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    seed: int,
    text_choice: Any,
    rid: str,
) -> Plan:
    """A plan for a chat request; ``text_choice(seed, index)`` gives (word pieces, finish)."""
    n = body.get("n") or 1
    fns = tools_to_call(body, messages)
    logprobs = body.get("logprobs") is True
    top = (body.get("top_logprobs") or 0) if logprobs else 0
    choices = []
    for i in range(n):
        s = choice_seed(seed, i)
        if fns:
            choice = Choice(i, [], "tool_calls")
            for k, fn in enumerate(fns):
                cid = f"call_{rid}" + (f"_{i}" if n > 1 else "") + (f"_{k}" if k else "")
                call = tool_call(fn, choice_seed(s, k), cid)
                args = pieces_of(call["function"]["arguments"]) or [""]
                choice.calls.append(call)
                choice.pieces += args
                choice.piece_call += [k] * len(args)
            choices.append(choice)
            continue
        structured = structured_text(body.get("response_format"), s)
        if structured is not None:
            pieces, finish = pieces_of(structured), "stop"
            limit = body.get("max_completion_tokens") or body.get("max_tokens")
            if isinstance(limit, int) and len(pieces) > limit:
                pieces, finish = pieces[:limit], "length"
        else:
            pieces, finish = text_choice(s, i)
        cut = apply_stop(pieces, body.get("stop"))
        if cut is not None:
            pieces, finish = cut, "stop"
        choice = Choice(i, pieces, finish)
        if logprobs:
            choice.logprobs = logprobs_for(pieces, s, top)
        choices.append(choice)
    return Plan(choices, top, logprobs)


def completion_plan(body: dict[str, Any], seed: int, text_choice: Any, prompt: str) -> Plan:
    n = body.get("n") or 1
    echo = prompt if body.get("echo") is True else ""
    top = body.get("logprobs")
    top = top if isinstance(top, int) and not isinstance(top, bool) else None
    choices = []
    for i in range(n):
        s = choice_seed(seed, i)
        pieces, finish = text_choice(s, i)
        cut = apply_stop(pieces, body.get("stop"))
        if cut is not None:
            pieces, finish = cut, "stop"
        choice = Choice(i, pieces, finish, echo=echo)
        if top is not None:
            choice.logprobs = logprobs_for(pieces, s, top)
        choices.append(choice)
    return Plan(choices, top or 0, top is not None)


def natural_words(seed: int, start: int, count: int, first: bool) -> list[str]:
    return word_pieces(word_ids(seed, start, count), first)
