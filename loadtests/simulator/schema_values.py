"""A value that validates against a JSON schema: structured output and tool-call arguments.

Covers what response formats and function parameters use in practice (and what the OpenAI SDK's
`to_strict_json_schema` emits for pydantic models): `$ref` into `$defs` / `definitions`, `allOf`,
`anyOf` / `oneOf` (the first branch that is not null), `enum`, `const`, objects (every declared
property, so `required` always holds), arrays (`minItems` / `maxItems`), strings (`minLength` /
`maxLength`, common `format`s), integers and numbers (bounds, exclusive bounds, `multipleOf`),
booleans and null. Values are drawn from a seeded RNG, so the same request gives the same output.
Unsupported keywords (`pattern`, `not`, `if`) are ignored: the value may then not validate.
"""

from __future__ import annotations

import math
import random
from typing import Any

from .text import VOCAB

MAX_DEPTH = 8  # recursive schemas (a tree of nodes) stop here with the smallest valid value
_FORMATS = {
    "date-time": "2024-05-01T12:00:00Z",
    "date": "2024-05-01",
    "time": "12:00:00",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
    "ipv4": "192.0.2.1",
}


def value_for(schema: Any, rng: random.Random) -> Any:
    """A JSON value valid for ``schema`` (a JSON Schema object, possibly with ``$defs``)."""
    root = schema if isinstance(schema, dict) else {}
    return _value(root, root, rng, 0)


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while isinstance(schema.get("$ref"), str) and seen < 32:
        ref = schema["$ref"]
        target: Any = root
        if ref.startswith("#"):
            for part in ref[1:].split("/"):
                if part:
                    target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
        else:
            target = {}
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest} if isinstance(target, dict) else rest
        seen += 1
    return schema


def _value(schema: Any, root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if not isinstance(schema, dict):
        return None if schema is False else "value"
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            part = _resolve(part, root) if isinstance(part, dict) else {}
            props = {**merged.get("properties", {}), **part.get("properties", {})}
            required = [*merged.get("required", []), *part.get("required", [])]
            merged = {**merged, **part, "properties": props, "required": required}
        return _value(merged, root, rng, depth)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            resolved = [_resolve(o, root) for o in options if isinstance(o, dict)]
            chosen = next((o for o in resolved if o.get("type") != "null"), resolved[0])
            return _value(chosen, root, rng, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        return _object(schema, root, rng, depth)
    if kind == "array":
        return _array(schema, root, rng, depth)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _object(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if depth >= MAX_DEPTH and name not in required:
            continue
        out[name] = _value(sub, root, rng, depth + 1)
    for name in required - out.keys():  # required but undeclared: any value will do
        out[name] = _word(rng)
    return out


def _array(schema: dict[str, Any], root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    lo = _int(schema.get("minItems"), 0)
    hi = _int(schema.get("maxItems"), max(lo, 3))
    count = lo if depth >= MAX_DEPTH else rng.randint(max(lo, min(1, hi)), max(lo, min(hi, 3)))
    prefix = schema.get("prefixItems")
    items = schema.get("items", {})
    out = []
    for i in range(count):
        sub = prefix[i] if isinstance(prefix, list) and i < len(prefix) else items
        out.append(_value(sub, root, rng, depth + 1))
    if schema.get("uniqueItems") and len({repr(v) for v in out}) < len(out):
        out = out[:1]
    return out


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _bounds(schema: dict[str, Any], lo: float, hi: float) -> tuple[float, float]:
    if isinstance(schema.get("minimum"), (int, float)):
        lo = schema["minimum"]
    if isinstance(schema.get("exclusiveMinimum"), (int, float)):
        lo = schema["exclusiveMinimum"]
    if isinstance(schema.get("maximum"), (int, float)):
        hi = schema["maximum"]
    if isinstance(schema.get("exclusiveMaximum"), (int, float)):
        hi = schema["exclusiveMaximum"]
    if lo > hi:
        lo, hi = hi, lo
    return lo, hi


def _integer(schema: dict[str, Any], rng: random.Random) -> int:
    lo, hi = _bounds(schema, 0, 100)
    low = math.floor(lo) + 1 if "exclusiveMinimum" in schema else math.ceil(lo)
    high = math.ceil(hi) - 1 if "exclusiveMaximum" in schema else math.floor(hi)
    step = schema.get("multipleOf")
    if isinstance(step, int) and step > 0:
        first = -(-low // step) * step
        choices = (high - first) // step + 1 if high >= first else 0
        return first + step * rng.randrange(choices) if choices > 0 else first
    return rng.randint(low, high) if high >= low else low


def _number(schema: dict[str, Any], rng: random.Random) -> float:
    lo, hi = _bounds(schema, 0.0, 100.0)
    if isinstance(schema.get("multipleOf"), (int, float)):
        return float(_integer(schema, rng))
    x = round(lo + (hi - lo) * (0.1 + 0.8 * rng.random()), 2)
    return x if lo < x < hi or lo == hi else (lo + hi) / 2


def _word(rng: random.Random) -> str:
    return VOCAB[rng.randrange(len(VOCAB))]


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if fmt in _FORMATS:
        return _FORMATS[fmt]
    lo = _int(schema.get("minLength"), 0)
    hi = _int(schema.get("maxLength"), 10_000)
    text = f"{_word(rng)} {_word(rng)}"
    while len(text) < lo:
        text += " " + _word(rng)
    return text[: max(hi, 0)] if len(text) > hi else text
