"""Request field checks: what every provider rejects when ill-typed, rejected before any call.

A request with `temperature: "hot"` or a tool without a name would cost an upstream call (and,
over a pool, one per retry) only to come back as the provider's 400. These checks answer that
400 at once, in OpenAI's own words: the same message wording, `code` and `param` (`temperature`,
`messages[0].role`, `tools[1].function.name`, `response_format.json_schema`) as the OpenAI API.

Only the fields listed here are checked; every other field passes through untouched (providers
have their own extensions), and so do tool and response-format types that other providers
define (Groq's `browser_search` tool, TGI's `json` and vLLM's `structural_tag` formats): only the
OpenAI types' shapes are checked. Cost: one dict lookup per body field, plus a short loop per message
and per tool; the fields' values are not copied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from gateway.errors import GatewayError, bad_request

# -- OpenAI's error wording -------------------------------------------------------------------

# Longest client value echoed in an error message: a 100k-character model name is not echoed whole.
ECHO_CHARS = 256


def clip(value: Any, limit: int = ECHO_CHARS) -> str:
    """A client value as echoed in an error message, cut to `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _kind(v: Any) -> str:
    """How OpenAI names the type it got: `but got a string instead`."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a decimal"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def invalid_type(param: str, expected: str, got: Any) -> GatewayError:
    return bad_request(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(got)} instead.",
        param=param,
        code="invalid_type",
    )


def missing(param: str) -> GatewayError:
    return bad_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def invalid_value(param: str, got: Any, supported: tuple[str, ...]) -> GatewayError:
    names = [f"'{s}'" for s in supported]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f", and {names[-1]}"
    return bad_request(
        f"Invalid value: '{clip(got)}'. Supported values are: {listed}.",
        param=param,
        code="invalid_value",
    )


def _above(param: str, limit: float, got: float) -> GatewayError:
    kind = "integer" if isinstance(got, int) else "decimal"
    return bad_request(
        f"Invalid '{param}': {kind} above maximum value. Expected a value <= {_num(limit)}, "
        f"but got {_num(got)} instead.",
        param=param,
        code=f"{kind}_above_max_value",
    )


def below_min(param: str, limit: float, got: float) -> GatewayError:
    kind = "integer" if isinstance(got, int) else "decimal"
    return bad_request(
        f"Invalid '{param}': {kind} below minimum value. Expected a value >= {_num(limit)}, "
        f"but got {_num(got)} instead.",
        param=param,
        code=f"{kind}_below_min_value",
    )


def _num(x: float) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _empty(param: str) -> GatewayError:
    return bad_request(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an "
        "empty array instead.",
        param=param,
        code="empty_array",
    )


# -- scalar fields ----------------------------------------------------------------------------

Check = Callable[[Any, str], None]


def _number(lo: float, hi: float) -> Check:
    def check(v: Any, p: str) -> None:
        if v is None:
            return
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise invalid_type(p, "a decimal", v)
        if v > hi:
            raise _above(p, hi, v)
        if v < lo:
            raise below_min(p, lo, v)

    return check


def _integer(lo: int | None, hi: int | None = None) -> Check:
    def check(v: Any, p: str) -> None:
        if v is None:
            return
        if not isinstance(v, int) or isinstance(v, bool):
            raise invalid_type(p, "an integer", v)
        if hi is not None and v > hi:
            raise _above(p, hi, v)
        if lo is not None and v < lo:
            raise below_min(p, lo, v)

    return check


def _boolean(v: Any, p: str) -> None:
    if v is not None and not isinstance(v, bool):
        raise invalid_type(p, "a boolean", v)


def _string(v: Any, p: str) -> None:
    if v is not None and not isinstance(v, str):
        raise invalid_type(p, "a string", v)


def _object(v: Any, p: str) -> None:
    if v is not None and not isinstance(v, dict):
        raise invalid_type(p, "an object", v)


#: OpenAI's limit on `stop`. A request translated from another API (Anthropic's
#: `stop_sequences`) has that API's own limit (`max_stop`).
MAX_STOP = 4


def _stop(v: Any, p: str, limit: int = MAX_STOP) -> None:
    if v is None or isinstance(v, str):
        return
    if not isinstance(v, list):
        raise invalid_type(p, "one of a string or array of strings", v)
    if not v:
        raise _empty(p)
    if len(v) > limit:
        raise bad_request(
            f"Invalid '{p}': array too long. Expected an array with maximum length {limit}, but "
            f"got an array with length {len(v)} instead.",
            param=p,
            code="array_above_max_length",
        )
    for i, s in enumerate(v):
        if not isinstance(s, str):
            raise invalid_type(f"{p}[{i}]", "a string", s)


def _stream_options(v: Any, p: str) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        raise invalid_type(p, "an object", v)
    for key in ("include_usage", "include_obfuscation"):
        if key in v:
            _boolean(v[key], f"{p}.{key}")


# -- prompt (completions) and input (embeddings) --------------------------------------------

# Token ids: non-negative and within int32 (every tokenizer's vocabulary is far smaller).
MAX_TOKEN_ID = 2**31 - 1
_PROMPT_KINDS = "one of a string, array of strings, array of integers, or array of integer arrays"


def _token(v: Any, p: str) -> None:
    if type(v) is not int:  # bool is not a token
        raise invalid_type(p, "an integer", v)
    if v < 0:
        raise below_min(p, 0, v)
    if v > MAX_TOKEN_ID:
        raise _above(p, MAX_TOKEN_ID, v)


# OpenAI's embeddings take at most 2048 inputs (or token ids) per request, none an empty string.
MAX_EMBEDDING_INPUTS = 2048


def _empty_string(param: str) -> GatewayError:
    return bad_request(
        f"Invalid '{param}': empty string. Expected a string with minimum length 1, but got an "
        "empty string instead.",
        param=param,
        code="empty_string",
    )


def _too_long(param: str, limit: int, got: int) -> GatewayError:
    return bad_request(
        f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, but "
        f"got an array with length {got} instead.",
        param=param,
        code="array_above_max_length",
    )


def check_prompt(
    v: Any,
    p: str,
    *,
    allow_empty: bool,
    max_items: int | None = None,
    empty_strings: bool = True,
) -> None:
    """A completions `prompt` or embeddings `input` as OpenAI's schema has it: a string, or an
    array of strings, of token ids, or of non-empty token id arrays (one kind throughout).
    `max_items` bounds the array and `empty_strings=False` refuses "" (embeddings' rules)."""
    if type(v) is str:
        if not v and not empty_strings:
            raise _empty_string(p)
        return
    if not isinstance(v, list):
        raise invalid_type(p, _PROMPT_KINDS, v)
    if not v:
        if allow_empty:  # completions: an empty array of strings is in the schema
            return
        raise _empty(p)
    if max_items is not None and len(v) > max_items:
        raise _too_long(p, max_items, len(v))
    first = v[0]
    if type(first) is str:
        for i, item in enumerate(v):
            if type(item) is not str:
                raise invalid_type(f"{p}[{i}]", "a string", item)
            if not item and not empty_strings:
                raise _empty_string(f"{p}[{i}]")
    elif type(first) is int:
        for i, item in enumerate(v):
            _token(item, f"{p}[{i}]")
    elif isinstance(first, list):
        for i, ids in enumerate(v):
            ip = f"{p}[{i}]"
            if not isinstance(ids, list):
                raise invalid_type(ip, "an array of integers", ids)
            if not ids:
                raise _empty(ip)
            for j, item in enumerate(ids):
                _token(item, f"{ip}[{j}]")
    else:
        raise invalid_type(f"{p}[0]", "one of a string, an integer, or an array of integers", first)


# -- tools ------------------------------------------------------------------------------------

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_TYPES = ("function", "custom")
TOOL_CHOICES = ("none", "auto", "required")


def _function_name(name: Any, p: str) -> None:
    if name is None:
        raise missing(p)
    if not isinstance(name, str):
        raise invalid_type(p, "a string", name)
    if len(name) > 64:
        raise bad_request(
            f"Invalid '{p}': string too long. Expected a string with maximum length 64, but got "
            f"a string with length {len(name)} instead.",
            param=p,
            code="string_above_max_length",
        )
    if not _FUNCTION_NAME.match(name):
        raise bad_request(
            f"Invalid '{p}': string does not match pattern. Expected a string that matches the "
            "pattern '^[a-zA-Z0-9_-]+$'.",
            param=p,
            code="invalid_value",
        )


def _plain_function(tool: Any) -> bool:
    """A well-formed function tool (the common case), decided without building any param path."""
    if type(tool) is not dict or tool.get("type") != "function":
        return False
    fn = tool.get("function")
    if type(fn) is not dict:
        return False
    name = fn.get("name")
    if type(name) is not str or len(name) > 64 or not _FUNCTION_NAME.match(name):
        return False
    params, desc, strict = fn.get("parameters"), fn.get("description"), fn.get("strict")
    return (
        (params is None or type(params) is dict)
        and (desc is None or type(desc) is str)
        and (strict is None or type(strict) is bool)
    )


def _tools(v: Any, p: str) -> None:
    if v is None:
        return
    if not isinstance(v, list):
        raise invalid_type(p, "an array", v)
    for i, tool in enumerate(v):
        if _plain_function(tool):
            continue
        tp = f"{p}[{i}]"
        if not isinstance(tool, dict):
            raise invalid_type(tp, "an object", tool)
        kind = tool.get("type")
        if kind is None:
            raise missing(f"{tp}.type")
        if not isinstance(kind, str):
            raise invalid_type(f"{tp}.type", "a string", kind)
        if kind not in TOOL_TYPES:
            continue  # a provider's own tool type (Groq's `browser_search`...): its to judge
        body = tool.get(kind)
        if body is None:
            raise missing(f"{tp}.{kind}")
        if not isinstance(body, dict):
            raise invalid_type(f"{tp}.{kind}", "an object", body)
        _function_name(body.get("name"), f"{tp}.{kind}.name")
        if kind == "function":
            _object(body.get("parameters"), f"{tp}.function.parameters")
            _string(body.get("description"), f"{tp}.function.description")
            _boolean(body.get("strict"), f"{tp}.function.strict")


def _tool_choice(v: Any, p: str) -> None:
    if v is None:
        return
    if isinstance(v, str):
        if v not in TOOL_CHOICES:
            raise invalid_value(p, v, TOOL_CHOICES)
        return
    if not isinstance(v, dict):
        raise invalid_type(p, "one of a string or object", v)
    kind = v.get("type")
    if kind is None:
        raise missing(f"{p}.type")
    if kind in TOOL_TYPES:
        named = v.get(kind)
        if not isinstance(named, dict):
            raise (
                missing(f"{p}.{kind}")
                if named is None
                else invalid_type(f"{p}.{kind}", "an object", named)
            )
        name = named.get("name")
        if name is None:
            raise missing(f"{p}.{kind}.name")
        if not isinstance(name, str):
            raise invalid_type(f"{p}.{kind}.name", "a string", name)
    elif not isinstance(kind, str):
        raise invalid_type(f"{p}.type", "a string", kind)


def _tool_pairing(body: dict[str, Any]) -> None:
    """`tool_choice` other than `none` needs tools, and a named choice must name one of them."""
    choice = body.get("tool_choice")
    if choice is None or choice == "none":
        return
    tools = body.get("tools")
    if not tools:
        raise bad_request(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
            "specified.",
            param="tool_choice",
        )
    if isinstance(choice, dict) and choice.get("type") in TOOL_TYPES:
        kind = choice["type"]
        name = choice[kind]["name"]
        if not any(t.get("type") == kind and t[kind].get("name") == name for t in tools):
            raise bad_request(
                f"Invalid value for 'tool_choice': no {kind} named '{clip(name)}' is specified in the "
                "'tools' parameter.",
                param="tool_choice",
            )


# -- response_format --------------------------------------------------------------------------


def _response_format(v: Any, p: str) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        raise invalid_type(p, "an object", v)
    kind = v.get("type")
    if kind is None:
        raise missing(f"{p}.type")
    if not isinstance(kind, str):
        raise invalid_type(f"{p}.type", "a string", kind)
    # Other providers' formats (TGI's `json` / `regex`, vLLM's `structural_tag`) pass through.
    if kind != "json_schema":
        return
    js = v.get("json_schema")
    if js is None:
        raise missing(f"{p}.json_schema")
    if not isinstance(js, dict):
        raise invalid_type(f"{p}.json_schema", "an object", js)
    name = js.get("name")
    if name is None:
        raise missing(f"{p}.json_schema.name")
    _function_name(name, f"{p}.json_schema.name")
    _object(js.get("schema"), f"{p}.json_schema.schema")
    _boolean(js.get("strict"), f"{p}.json_schema.strict")


# -- messages ---------------------------------------------------------------------------------

ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# OpenAI's content part types, then those that OpenAI-compatible servers add (vLLM's video_url and
# audio_url, Mistral's document_url and input_image); anything else is a typo or another API's
# block, which every provider rejects.
PART_TYPES = (
    "text", "image_url", "input_audio", "file", "refusal",
    "video_url", "audio_url", "document_url", "input_image",
)  # fmt: skip
# Roles whose `content` is required (the assistant's may be null or absent: tool calls only).
_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool", "function"})


def check_messages(messages: Any) -> None:
    """Roles and content shapes, with OpenAI's `messages[i].field` params."""
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    if not messages:
        raise _empty("messages")
    for i, m in enumerate(messages):
        # The common message, `{"role": "user", "content": "text"}`, in three lookups.
        if (
            type(m) is dict
            and len(m) == 2
            and type(m.get("content")) is str
            and type(role := m.get("role")) is str  # hashed next: a list or object is not
            and role in _PLAIN_ROLES
        ):
            continue
        _check_message(i, m)


def _check_message(i: int, m: Any) -> None:
    if not isinstance(m, dict):
        raise invalid_type(f"messages[{i}]", "an object", m)
    role = m.get("role")
    if role not in ROLES:
        if role is None:
            raise missing(f"messages[{i}].role")
        if not isinstance(role, str):
            raise invalid_type(f"messages[{i}].role", "a string", role)
        raise invalid_value(f"messages[{i}].role", role, ROLES)
    content = m.get("content")
    if content is None:
        # `function` messages may say null, but must say it.
        if role in _CONTENT_REQUIRED and not (role == "function" and "content" in m):
            raise missing(f"messages[{i}].content")
    elif not isinstance(content, str):
        _content_parts(content, f"messages[{i}].content")
    if role == "tool":
        tid = m.get("tool_call_id")
        if tid is None:
            raise missing(f"messages[{i}].tool_call_id")
        if not isinstance(tid, str):
            raise invalid_type(f"messages[{i}].tool_call_id", "a string", tid)
    elif role == "assistant" and m.get("tool_calls") is not None:
        _tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid_type(f"messages[{i}].name", "a string", name)


def _content_parts(content: Any, p: str) -> None:
    if not isinstance(content, list):
        raise invalid_type(p, "one of a string or array of objects", content)
    if not content:
        raise _empty(p)
    for j, part in enumerate(content):
        pp = f"{p}[{j}]"
        if not isinstance(part, dict):
            raise invalid_type(pp, "an object", part)
        kind = part.get("type")
        if kind is None:
            raise missing(f"{pp}.type")
        if not isinstance(kind, str):
            raise invalid_type(f"{pp}.type", "a string", kind)
        if kind not in PART_TYPES:
            raise invalid_value(f"{pp}.type", kind, PART_TYPES)
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise (
                    missing(f"{pp}.text")
                    if text is None
                    else invalid_type(f"{pp}.text", "a string", text)
                )


def _tool_calls(calls: Any, p: str) -> None:
    if not isinstance(calls, list):
        raise invalid_type(p, "an array", calls)
    for k, call in enumerate(calls):
        cp = f"{p}[{k}]"
        if not isinstance(call, dict):
            raise invalid_type(cp, "an object", call)
        for key in ("id", "type"):
            if not isinstance(call.get(key), str):
                raise (
                    missing(f"{cp}.{key}")
                    if call.get(key) is None
                    else invalid_type(f"{cp}.{key}", "a string", call.get(key))
                )
        fn = call.get(call["type"])
        if call["type"] == "function":
            if not isinstance(fn, dict):
                raise (
                    missing(f"{cp}.function")
                    if fn is None
                    else invalid_type(f"{cp}.function", "an object", fn)
                )
            for key in ("name", "arguments"):
                if not isinstance(fn.get(key), str):
                    raise (
                        missing(f"{cp}.function.{key}")
                        if fn.get(key) is None
                        else (invalid_type(f"{cp}.function.{key}", "a string", fn.get(key)))
                    )


# -- per endpoint -----------------------------------------------------------------------------

_TEMPERATURE = _number(0, 2)
_TOP_P = _number(0, 1)
_PENALTY = _number(-2, 2)
_SEED = _integer(None)

# Fields of a chat body checked here (`n`, `max_tokens`, `stream` are read and checked by accept).
CHAT: dict[str, Check] = {
    "temperature": _TEMPERATURE,
    "top_p": _TOP_P,
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "seed": _SEED,
    "stop": _stop,
    "logprobs": _boolean,
    "top_logprobs": _integer(0, 20),
    "stream_options": _stream_options,
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _boolean,
    "response_format": _response_format,
    "logit_bias": _object,
    "user": _string,
}
COMPLETIONS: dict[str, Check] = {
    "temperature": _TEMPERATURE,
    "top_p": _TOP_P,
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "seed": _SEED,
    "stop": _stop,
    "logprobs": _integer(0, 5),
    "echo": _boolean,
    "suffix": _string,
    "stream_options": _stream_options,
    "logit_bias": _object,
    "user": _string,
}
ENCODING_FORMATS = ("float", "base64")


def _encoding_format(v: Any, p: str) -> None:
    if v is not None and v not in ENCODING_FORMATS:
        if not isinstance(v, str):
            raise invalid_type(p, "a string", v)
        raise invalid_value(p, v, ENCODING_FORMATS)


EMBEDDINGS: dict[str, Check] = {
    "dimensions": _integer(1),
    "encoding_format": _encoding_format,
    "user": _string,
}
BY_ENDPOINT = {"chat": CHAT, "completions": COMPLETIONS, "embeddings": EMBEDDINGS}


def check_fields(
    body: dict[str, Any], endpoint: str, stream: bool, max_stop: int = MAX_STOP
) -> None:
    """Raise a 400 GatewayError for the first ill-typed or out-of-range field."""
    checks = BY_ENDPOINT[endpoint]
    for name, value in body.items():
        check = checks.get(name)
        if check is not None:
            if name == "stop" and max_stop != MAX_STOP:
                _stop(value, name, max_stop)
            else:
                check(value, name)
    if endpoint == "embeddings":
        return
    if body.get("stream_options") is not None and not stream:
        raise bad_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    if endpoint == "chat":
        if body.get("top_logprobs") and body.get("logprobs") is not True:
            raise bad_request(
                "Invalid value for 'logprobs': must be true when 'top_logprobs' is specified.",
                param="logprobs",
                code="invalid_value",
            )
        if "tool_choice" in body:
            _tool_pairing(body)


def chat_only_output(body: Mapping[str, Any]) -> str | None:
    """The first output a chat request asks for that only OpenAI's chat API produces, or None.

    Anthropic, Gemini and Bedrock answers carry text and tool calls only: a provider that drops
    these fields would answer 200 without what was asked (no logprobs, no audio), so such a
    request is refused there (another member may serve it; alone it is a clear 400).
    """
    if body.get("logprobs") or body.get("top_logprobs"):
        return "logprobs"
    modalities = body.get("modalities")
    if body.get("audio") is not None or (
        isinstance(modalities, list) and any(m != "text" for m in modalities)
    ):
        return "audio output"
    if body.get("web_search_options") is not None:
        return "web_search_options"
    if body.get("functions"):  # legacy function calling: answered with `function_call`
        return "functions"
    return None


def assistant_text_parts(content: Any) -> Any:
    """An assistant message's content with its `refusal` parts as text parts.

    A refusal part is what the assistant said when it declined; the OpenAI SDK sends it back in
    the history as it came. Vendors with no refusal part take it as the text it is.
    """
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": p["refusal"]}
        if isinstance(p, dict) and p.get("type") == "refusal" and isinstance(p.get("refusal"), str)
        else p
        for p in content
    ]


ALLOWED_TOOLS_MODES = ("auto", "required")


def narrowed_to_allowed_tools(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body with a `tool_choice` of type `allowed_tools` in the plain forms every vendor has:
    only the allowed tools offered, `tool_choice` their mode. That is what it asks (OpenAI keeps
    the whole list only so that its prompt cache holds). A body without one, or with one that is
    not well formed, comes back as it is."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return body
    spec = choice.get("allowed_tools")
    tools = body.get("tools")
    if not isinstance(spec, dict) or not isinstance(tools, list):
        return body
    mode, allowed = spec.get("mode"), spec.get("tools")
    if mode not in ALLOWED_TOOLS_MODES or not isinstance(allowed, list) or not allowed:
        return body
    names = set()
    for ref in allowed:
        kind = ref.get("type") if isinstance(ref, dict) else None
        named = ref.get(kind) if isinstance(ref, dict) and isinstance(kind, str) else None
        if not isinstance(named, dict) or not isinstance(named.get("name"), str):
            return body
        names.add((kind, named["name"]))
    kept = [
        t
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get(t.get("type") or ""), dict)
        and (t["type"], t[t["type"]].get("name")) in names
    ]
    if len(kept) != len(names):  # an allowed tool that is not offered: left to the vendor
        return body
    return {**body, "tools": kept, "tool_choice": mode}
