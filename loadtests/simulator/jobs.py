"""Turn a request body into a generation job: prompt, seed, output length, continuation, plan.

Only the fields the simulator acts on are checked; every other field is ignored, as a lenient
OpenAI-compatible server would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .behaviour import Plan, chat_plan, completion_plan, natural_words, needs_plan
from .profiles import Profile
from .text import (
    content_text,
    count_tokens,
    count_words,
    natural_length,
    render_messages,
    text_seed,
)


class BadRequest(Exception):
    """A 400 with an OpenAI-shaped body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(slots=True)
class Job:
    model: str
    stream: bool
    include_usage: bool
    prompt_text: str  # what is prefilled (and prefix-cached)
    prompt_tokens: int
    seed: int  # of the word sequence
    start: int  # words already present in a trailing partial answer
    first: bool  # the output starts the answer: no leading space
    n_out: int
    finish: str
    # n, tools, structured output, logprobs, stop: what each choice says (None: plain text,
    # served from precomputed pieces).
    plan: Plan | None = None

    @property
    def out_tokens(self) -> int:
        """Completion tokens of the whole answer (all choices)."""
        return self.plan.tokens if self.plan is not None else self.n_out


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _int_field(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadRequest(f"{name} must be a non-negative integer", name)
    return v


def _common(body: dict[str, Any], profile: Profile) -> tuple[str, bool, bool, int | None]:
    model = body.get("model", profile.models[0])
    if not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("stream must be a boolean", "stream")
    opts = body.get("stream_options")
    include_usage = bool(stream and isinstance(opts, dict) and opts.get("include_usage"))
    limit = _int_field(body, "max_completion_tokens")
    if limit is None:
        limit = _int_field(body, "max_tokens")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer", "seed")
    return model, bool(stream), include_usage, limit


def _length(limit: int | None, seed: int, start: int, profile: Profile) -> tuple[int, str]:
    """Tokens to emit and the finish reason: max_tokens is the budget from ``start`` on."""
    if limit is not None:
        n = min(limit, profile.max_output)
        if profile.zero_latency:  # the static answer's length at most
            n = min(n, profile.static_output_tokens)
        return n, "length"
    # Natural length of the whole answer, drawn from its own seed, minus what is already there.
    total = natural_length(seed, profile.output_mean, profile.output_sigma, profile.max_output)
    if profile.zero_latency:
        total = min(total, profile.static_output_tokens)
    return max(0, total - start), "stop"


def chat_job(body: dict[str, Any], profile: Profile, rid: str) -> Job:
    model, stream, include_usage, limit = _common(body, profile)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequest("each message must be an object", "messages")
    prompt_text = render_messages(messages)
    last = messages[-1]
    partial = None
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        partial = content_text(last.get("content"))
        messages = messages[:-1]
    seed = text_seed(render_messages(messages), body.get("seed"))
    start = count_words(partial) if partial else 0
    first = start == 0 or (partial or "")[-1:].isspace()
    n_out, finish = _length(limit, seed, start, profile)
    job = Job(
        model,
        stream,
        include_usage,
        prompt_text,
        count_tokens(prompt_text),
        seed,
        start,
        first,
        n_out,
        finish,
    )
    if needs_plan(body):

        def text(s: int, i: int) -> tuple[list[str], str]:
            begin = start if i == 0 else 0
            n, finish = _length(limit, s, begin, profile)
            return natural_words(s, begin, n, first if i == 0 else True), finish

        job.plan = chat_plan(body, messages, seed, text, rid)
        job.n_out = max(1, job.plan.longest)
    return job


def completion_job(body: dict[str, Any], profile: Profile) -> Job:
    model, stream, include_usage, limit = _common(body, profile)
    prompt = body.get("prompt", "")
    if isinstance(prompt, str):
        text, tokens = prompt, count_tokens(prompt)
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        text = "\n".join(prompt)  # one choice for all prompts: n and batched prompts unsupported
        tokens = count_tokens(text)
    elif isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        text, tokens = " ".join(map(str, prompt)), len(prompt)
    else:
        raise BadRequest("prompt must be a string, a list of strings or a list of tokens", "prompt")
    seed = text_seed(text, body.get("seed"))
    n_out, finish = _length(limit, seed, 0, profile)
    job = Job(model, stream, include_usage, text, tokens, seed, 0, True, n_out, finish)
    if needs_plan(body):

        def words(s: int, i: int) -> tuple[list[str], str]:
            n, finish = _length(limit, s, 0, profile)
            return natural_words(s, 0, n, True), finish

        job.plan = completion_plan(body, seed, words, text)
        job.n_out = max(1, job.plan.longest)
    return job


def check_context(job: Job, profile: Profile) -> None:
    """Reject prompts longer than the context window, as vLLM and llama.cpp do."""
    if job.prompt_tokens > profile.context_window:
        raise BadRequest(
            f"This model's maximum context length is {profile.context_window} tokens; "
            f"the prompt has {job.prompt_tokens} tokens.",
            "messages",
            "context_length_exceeded",
        )
