"""Degradation rules: what the gateway answers when no provider can.

Ops write the rules as YAML in ``fallbacks/``. Files are read in name order; their ``rules``
are tried in that order and the first match wins; one file may hold the catch-all ``default``.
A rule matches when every criterion it names matches (``aliases``, ``classes``, ``tenants``,
``keywords`` - any of the listed values, case-insensitive - and ``regex`` searched in the last
user message). Its answer is a marked, OpenAI-shaped ``chat.completion`` (or SSE chunks when the
request streamed) built from ``template``; ``status`` >= 400 answers with an OpenAI error body
instead, and ``queue: true`` tells the pipeline to defer the request for replay.

:class:`RuleStore` hot-reloads the folder: a broken file is refused with a log line naming the
file, field and line, and the rules in force stay. The files' schema and loading are
gateway.policy.rules (a policy is only accepted with rules that load).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.infra.filewatch import FileWatch, file_signature

# The rule files' schema and loading live in the policy layer (the policy check loads them too);
# re-exported here, where the answering side has always found them.
from gateway.policy.rules import (
    PLACEHOLDERS,
    DefaultRule,
    Rule,
    RuleFile,
    RuleFileError,
    RuleMatch,
    RuleSet,
    load_file,
    load_rules,
    rule_files,
)

log = logging.getLogger(__name__)

Fingerprint = tuple[Any, tuple[tuple[str, Any], ...]] | None

_ERROR_TYPES = {429: "rate_limit_exceeded", 503: "service_unavailable"}

__all__ = [
    "BUILTIN_DEFAULT",
    "PLACEHOLDERS",
    "DefaultRule",
    "DegradeContext",
    "DegradedResponse",
    "Rule",
    "RuleFile",
    "RuleFileError",
    "RuleMatch",
    "RuleSet",
    "RuleStore",
    "last_user_text",
    "load_file",
    "load_rules",
    "render",
    "render_json",
    "render_sse",
    "render_text",
    "rule_files",
]


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


def render_json(rule: DefaultRule, ctx: DegradeContext, completions: bool = False) -> bytes:
    """A ``chat.completion`` body (a ``text_completion`` one for the completions API), or an
    OpenAI error body when the rule's status >= 400."""
    text = render_text(rule, ctx)
    if rule.status >= 400:
        error = {
            "message": text,
            "type": _ERROR_TYPES.get(rule.status, "degraded"),
            "param": None,
            "code": "degraded",
        }
        return orjson.dumps({"error": error})
    if completions:
        body = _base(rule, ctx, "text_completion")
        body["id"] = f"cmpl-degraded-{ctx.request_id}"
        body["choices"] = [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]
        body["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return orjson.dumps(body)
    message = {"role": "assistant", "content": text, "refusal": None}
    body = _base(rule, ctx, "chat.completion")
    body["choices"] = [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}]
    body["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return orjson.dumps(body)


def render_sse(
    rule: DefaultRule, ctx: DegradeContext, include_usage: bool = False, completions: bool = False
) -> list[bytes]:
    """``chat.completion.chunk`` events (role, content, stop) and ``data: [DONE]``; for the
    completions API ``text_completion`` events (text, stop)."""
    if rule.status >= 400:
        raise ValueError("an error status is answered as JSON, not as a stream")
    text = render_text(rule, ctx)
    if completions:
        base = {**_base(rule, ctx, "text_completion"), "id": f"cmpl-degraded-{ctx.request_id}"}
        events = [
            b"data: "
            + orjson.dumps(
                {**base, "choices": [{"index": 0, "text": t, "finish_reason": f, "logprobs": None}]}
            )
            + b"\n\n"
            for t, f in ((text, None), ("", "stop"))
        ]
        if include_usage:
            usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            events.append(
                b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            )
        events.append(b"data: [DONE]\n\n")
        return events
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
    rule: DefaultRule,
    ctx: DegradeContext,
    stream: bool,
    include_usage: bool = False,
    completions: bool = False,
) -> DegradedResponse:
    """Everything the HTTP layer needs: status, headers and the body or the SSE events."""
    headers = {"x-gateway-degraded": rule.name}
    if rule.status in (429, 503):
        headers["retry-after"] = str(_retry_after(rule, ctx))
    if stream and rule.status < 400:
        headers["content-type"] = "text/event-stream"
        chunks = render_sse(rule, ctx, include_usage, completions)
        return DegradedResponse(rule.status, headers, chunks=chunks, queue=rule.queue)
    headers["content-type"] = "application/json"
    body = render_json(rule, ctx, completions)
    return DegradedResponse(rule.status, headers, body=body, queue=rule.queue)


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
        # Editors write temp files and renames, and mounted config (Kubernetes ConfigMaps) swaps
        # a symlinked folder, not the .yaml files: a reload follows a change of what the files
        # resolve to. The signature is also compared every second without events, as the
        # policy watcher's is: when the rules folder is itself a symlink into `..data` (a
        # projected volume), the watch stays on the old folder, which the swap deletes.
        self._watch = FileWatch(
            self.path if self.path.is_dir() else self.path.parent,
            self.reload_async,
            signature=self._fingerprint,
            debounce_ms=debounce_ms,
            force_polling=force_polling,
            catch_up=self._catch_up,
            name="fallback-rules-watch",
        )
        self._seen: Fingerprint = None

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

    def _fingerprint(self) -> Fingerprint:
        """What the rules path and each rule file resolve to now (real path, inode, size, mtime)."""
        with contextlib.suppress(OSError):
            files = tuple((str(p), file_signature(p)) for p in rule_files(self.path))
            return file_signature(self.path), files
        return None

    def _catch_up(self) -> None:
        """Reload if files changed between the initial load and the watcher being ready."""
        if self._fingerprint() != self._seen:
            self.reload()
