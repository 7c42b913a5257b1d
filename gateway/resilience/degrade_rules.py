"""Degradation rules: what the gateway answers when no provider can.

Ops write the rules as YAML in ``fallbacks/``. Files are read in name order; their ``rules``
are tried in that order and the first match wins; one file may hold the catch-all ``default``.
A rule matches when every criterion it names matches (``aliases``, ``classes``, ``tenants``,
``keywords`` - any of the listed values, case-insensitive - and ``regex`` searched in the last
user message). Its answer is a marked, OpenAI-shaped ``chat.completion`` (or SSE chunks when the
request streamed) built from ``template``; ``status`` >= 400 answers with an OpenAI error body
instead, and ``queue: true`` tells the pipeline to defer the request for replay.

:class:`RuleStore` hot-reloads the folder: a broken file is refused with a log line naming the
file and field, and the rules in force stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import string
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.infra.filewatch import FileWatch
from gateway.policy.source import MAX_BYTES, YamlLimitError, load_yaml

log = logging.getLogger(__name__)

PLACEHOLDERS = frozenset({"alias", "model", "request_id", "retry_after_s", "tenant", "class"})
_ERROR_TYPES = {429: "rate_limit_exceeded", 503: "service_unavailable"}


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file and the field path."""

    def __init__(self, file: str, field_path: str, problem: str) -> None:
        self.file, self.field_path, self.problem = file, field_path, problem
        where = f"{file}: {field_path}" if field_path else file
        super().__init__(f"{where}: {problem}")


def _casefold_all(values: list[str]) -> list[str]:
    return [v.casefold() for v in values]


class RuleMatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    aliases: list[str] = Field(default_factory=list)
    classes: list[str] = Field(default_factory=list)
    tenants: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    regex: str | None = None

    _sets: tuple[frozenset[str], frozenset[str], frozenset[str]] = PrivateAttr()
    _keywords: tuple[str, ...] = PrivateAttr()
    _regex: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _compile(self) -> RuleMatch:
        if not (self.aliases or self.classes or self.tenants or self.keywords or self.regex):
            raise ValueError("a rule needs at least one criterion (use `default` for a catch-all)")
        self._sets = (
            frozenset(_casefold_all(self.aliases)),
            frozenset(_casefold_all(self.classes)),
            frozenset(_casefold_all(self.tenants)),
        )
        self._keywords = tuple(_casefold_all(self.keywords))
        self._regex = re.compile(self.regex) if self.regex else None
        return self

    def matches(self, alias: str, cls: str, tenant: str, text: str, text_cf: str) -> bool:
        aliases, classes, tenants = self._sets
        if aliases and alias.casefold() not in aliases:
            return False
        if classes and cls.casefold() not in classes:
            return False
        if tenants and tenant.casefold() not in tenants:
            return False
        if self._keywords and not any(k in text_cf for k in self._keywords):
            return False
        return not (self._regex is not None and self._regex.search(text) is None)


class DefaultRule(BaseModel):
    """The answer itself; the catch-all ``default`` has nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="default", min_length=1)
    template: str = Field(min_length=1)
    status: int = Field(default=200, ge=200, le=599)
    queue: bool = False
    retry_after_s: float = Field(
        default=30.0, ge=0, description="Used when the gateway knows none."
    )

    @field_validator("template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(value)]
        except ValueError as exc:
            raise ValueError(
                f"bad placeholder syntax ({exc}); write {{{{ }}}} for braces"
            ) from None
        used = [(f, spec, conv) for f, spec, conv in parsed if f is not None]
        unknown = sorted({f for f, _, _ in used if f not in PLACEHOLDERS})
        if unknown or any(spec or conv for _, spec, conv in used):
            allowed = ", ".join(sorted(PLACEHOLDERS))
            raise ValueError(
                f"unknown placeholder {unknown or '(format spec)'}; allowed: {allowed}"
            )
        return value


class Rule(DefaultRule):
    name: str = Field(min_length=1)
    match: RuleMatch


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[Rule] = Field(default_factory=list)
    default: DefaultRule | None = None


@dataclass(frozen=True)
class RuleSet:
    """Rules of all files in order, plus the catch-all (if a file defines one)."""

    rules: tuple[Rule, ...] = ()
    default: DefaultRule | None = None
    files: tuple[str, ...] = ()

    def match(self, alias: str, cls: str, tenant: str, last_user_text: str) -> DefaultRule | None:
        """First rule that matches, else the default, else None."""
        text_cf = last_user_text.casefold()
        for rule in self.rules:
            if rule.match.matches(alias, cls, tenant, last_user_text, text_cf):
                return rule
        return self.default


BUILTIN_DEFAULT = DefaultRule(
    name="builtin-default",
    template="No model can answer for {alias} right now. Please retry in about "
    "{retry_after_s} seconds. (request {request_id})",
    status=503,
)


def last_user_text(messages: Any) -> str:
    """Text of the last ``user`` message (string content or the text parts of a list)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if isinstance(p, dict)]
                return " ".join(p for p in parts if isinstance(p, str) and p)
            return ""
    return ""


# ---- loading --------------------------------------------------------------------------------


def _field_path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_file(path: Path) -> RuleFile:
    """Parse and validate one YAML file; :class:`RuleFileError` names file and field."""
    try:
        # Bounded size and alias expansion, like policy files (a YAML bomb is refused).
        if path.stat().st_size > MAX_BYTES:
            raise YamlLimitError(f"the file is larger than {MAX_BYTES} bytes")
        raw, _ = load_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RuleFileError(str(path), "", f"cannot read: {exc}") from None
    except YamlLimitError as exc:
        raise RuleFileError(str(path), "", f"refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise RuleFileError(str(path), where, f"invalid YAML: {exc}") from None
    if raw is None:
        raw = {}
    try:
        return RuleFile.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        problem = str(errors[0]["msg"]).removeprefix("Value error, ")
        for more in errors[1:]:  # every problem at once: one edit fixes them all
            problem += f"; {_field_path(more['loc'])}: {more['msg']}".replace("Value error, ", "")
        raise RuleFileError(str(path), _field_path(errors[0]["loc"]), problem) from None


def rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


def load_rules(path: str | Path) -> RuleSet:
    """Load one rule file or every ``*.yaml``/``*.yml`` of a folder (in name order)."""
    root = Path(path)
    if not root.exists():
        raise RuleFileError(str(root), "", "no such file or folder")
    rules: list[Rule] = []
    default: DefaultRule | None = None
    default_file, names = "", dict[str, str]()
    files = rule_files(root)
    for file in files:
        parsed = load_file(file)
        for i, rule in enumerate(parsed.rules):
            if rule.name in names:
                raise RuleFileError(
                    str(file),
                    f"rules[{i}].name",
                    f"{rule.name!r} already used in {names[rule.name]}",
                )
            names[rule.name] = str(file)
            rules.append(rule)
        if parsed.default is not None:
            if default is not None:
                raise RuleFileError(str(file), "default", f"a default is already in {default_file}")
            default, default_file = parsed.default, str(file)
    return RuleSet(tuple(rules), default, tuple(str(f) for f in files))


# ---- rendering ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DegradeContext:
    """What the template may mention about the request being answered."""

    alias: str
    request_id: str
    tenant: str = ""
    cls: str = ""
    retry_after_s: float | None = None


@dataclass(frozen=True)
class DegradedResponse:
    status: int
    headers: dict[str, str]
    body: bytes | None = None  # JSON body, when not streamed
    chunks: list[bytes] = field(default_factory=list)  # SSE events, when streamed
    queue: bool = False


def _retry_after(rule: DefaultRule, ctx: DegradeContext) -> int:
    value = rule.retry_after_s if ctx.retry_after_s is None else ctx.retry_after_s
    return max(0, math.ceil(value))


def render_text(rule: DefaultRule, ctx: DegradeContext) -> str:
    return rule.template.format_map(
        {
            "alias": ctx.alias,
            "model": ctx.alias,
            "request_id": ctx.request_id,
            "retry_after_s": _retry_after(rule, ctx),
            "tenant": ctx.tenant,
            "class": ctx.cls,
        }
    )


def _base(rule: DefaultRule, ctx: DegradeContext, obj: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-degraded-{ctx.request_id}",
        "object": obj,
        "created": int(time.time()),
        "model": ctx.alias,
        "system_fingerprint": f"gateway-degraded:{rule.name}",
    }


def render_json(rule: DefaultRule, ctx: DegradeContext) -> bytes:
    """A ``chat.completion`` body, or an OpenAI error body when the rule's status >= 400."""
    text = render_text(rule, ctx)
    if rule.status >= 400:
        error = {
            "message": text,
            "type": _ERROR_TYPES.get(rule.status, "degraded"),
            "param": None,
            "code": "degraded",
        }
        return orjson.dumps({"error": error})
    message = {"role": "assistant", "content": text, "refusal": None}
    body = _base(rule, ctx, "chat.completion")
    body["choices"] = [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}]
    body["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return orjson.dumps(body)


def render_sse(rule: DefaultRule, ctx: DegradeContext, include_usage: bool = False) -> list[bytes]:
    """``chat.completion.chunk`` events (role, content, stop) and ``data: [DONE]``."""
    if rule.status >= 400:
        raise ValueError("an error status is answered as JSON, not as a stream")
    text = render_text(rule, ctx)
    base = _base(rule, ctx, "chat.completion.chunk")
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"role": "assistant", "content": ""}, None),
        ({"content": text}, None),
        ({}, "stop"),
    ]
    events = []
    for delta, finish in deltas:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        events.append(b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n")
    if include_usage:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        events.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def render(
    rule: DefaultRule, ctx: DegradeContext, stream: bool, include_usage: bool = False
) -> DegradedResponse:
    """Everything the HTTP layer needs: status, headers and the body or the SSE events."""
    headers = {"x-gateway-degraded": rule.name}
    if rule.status in (429, 503):
        headers["retry-after"] = str(_retry_after(rule, ctx))
    if stream and rule.status < 400:
        headers["content-type"] = "text/event-stream"
        chunks = render_sse(rule, ctx, include_usage)
        return DegradedResponse(rule.status, headers, chunks=chunks, queue=rule.queue)
    headers["content-type"] = "application/json"
    return DegradedResponse(rule.status, headers, body=render_json(rule, ctx), queue=rule.queue)


# ---- hot reload -----------------------------------------------------------------------------


class RuleStore:
    """The rules in force, reloaded when the folder changes; a bad edit never replaces them."""

    def __init__(
        self, path: str | Path, debounce_ms: int = 200, force_polling: bool | None = None
    ) -> None:
        self.path = Path(path)
        self.rules: RuleSet = RuleSet()
        self.version = 0
        self.last_error: RuleFileError | None = None
        # Any change in the folder reloads: editors write temp files and renames, and mounted
        # config (e.g. Kubernetes ConfigMaps) swaps a symlinked folder, not the .yaml files.
        self._watch = FileWatch(
            self.path if self.path.is_dir() else self.path.parent,
            self.reload_async,
            debounce_ms=debounce_ms,
            force_polling=force_polling,
            catch_up=self._catch_up,
            name="fallback-rules-watch",
        )
        self._seen: tuple[tuple[str, int, int], ...] = ()

    def reload(self) -> bool:
        """Load now; on error log it, keep the previous rules, return False."""
        self._seen = self._fingerprint()
        try:
            rules = load_rules(self.path)
        except RuleFileError as exc:
            return self._refused(exc)
        return self._apply(rules)

    async def reload_async(self) -> bool:
        """`reload`, with the files read and parsed in a worker thread (off the event loop)."""
        self._seen = self._fingerprint()
        try:
            rules = await asyncio.to_thread(load_rules, self.path)
        except RuleFileError as exc:
            return self._refused(exc)
        return self._apply(rules)

    def _refused(self, exc: RuleFileError) -> bool:
        self.last_error = exc
        log.error("fallback rules not reloaded, keeping version %d: %s", self.version, exc)
        return False

    def _apply(self, rules: RuleSet) -> bool:
        self.rules, self.last_error = rules, None
        self.version += 1
        log.info(
            "fallback rules v%d loaded: %d rules from %d files",
            self.version,
            len(rules.rules),
            len(rules.files),
        )
        return True

    async def start(self) -> None:
        """Load (raising on a broken file at start-up) and watch for changes."""
        self._seen = self._fingerprint()
        self.rules = load_rules(self.path)
        self.version += 1
        self._watch.start()

    async def stop(self) -> None:
        await self._watch.stop()

    def match(self, alias: str, cls: str, tenant: str, last_user_text: str) -> DefaultRule:
        """The rule to answer with; the built-in default when no file defines one."""
        return self.rules.match(alias, cls, tenant, last_user_text) or BUILTIN_DEFAULT

    def _fingerprint(self) -> tuple[tuple[str, int, int], ...]:
        with contextlib.suppress(OSError):
            stats = [(str(p), p.stat()) for p in rule_files(self.path)]
            return tuple((name, st.st_mtime_ns, st.st_size) for name, st in stats)
        return ()

    def _catch_up(self) -> None:
        """Reload if files changed between the initial load and the watcher being ready."""
        if self._fingerprint() != self._seen:
            self.reload()
