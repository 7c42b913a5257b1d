"""The `gemini` adapter: Google's Gemini API, generateContent and streamGenerateContent (SSE).

The key (api_key_env) travels in the `x-goog-api-key` header; the translation is in
gemini_mapping (pure functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from gateway.policy.schema import Timeouts
from gateway.providers.base import Adapter, StreamTranslator, UpstreamRequest, register
from gateway.providers.common import first_tool_call_only, one_tool_call, wants_usage
from gateway.providers.gemini_mapping import (
    BadAnswer,
    GeminiStream,
    StreamError,
    TranslationError,
    chat_to_gemini,
    gemini_to_chat,
    map_error,
)
from gateway.providers.settings import GeminiSettings
from gateway.providers.upstream import (
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
    forwardable_headers,
    parse_retry_after,
)
from gateway.wire.answer_checks import InvalidAnswer


@register
class GeminiAdapter(Adapter):
    type = "gemini"
    endpoints = frozenset({"chat"})

    def __init__(self, config: Any, api_key: str | None) -> None:
        super().__init__(config, api_key)
        self.settings: GeminiSettings = config.gemini or GeminiSettings()

    def auth_headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self.api_key} if self.api_key else {}

    def failure(
        self, status: int, body: bytes, headers: Mapping[str, str], ratelimit: bool
    ) -> UpstreamFailure:
        mapped = map_error(status, body)
        retry = parse_retry_after(headers.get("retry-after"))
        return UpstreamFailure(
            mapped.kind,
            f"provider answered {status}",
            status=mapped.status,
            body=mapped.body,
            headers=forwardable_headers(headers, ratelimit),
            retry_after=retry if mapped.kind == "rate_limited" else None,
        )

    # is_stream / first_event_complete: the base class's SSE checks (alt=sse streams are SSE).

    def request(
        self, endpoint: str, body: dict[str, Any], model: str, stream: bool
    ) -> UpstreamRequest:
        try:
            doc = chat_to_gemini(body)
        except TranslationError as e:
            raise UpstreamFailure("unsupported", f"gemini: {e}") from None
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        model_id = quote(model.removeprefix("models/"), safe="")
        path = f"/{self.settings.api_version}/models/{model_id}:{method}"
        return UpstreamRequest(path, orjson.dumps(doc))

    async def send(
        self,
        client: UpstreamClient,
        endpoint: str,
        body: dict[str, Any],
        model: str,
        headers: dict[str, str] | None,
        timeouts: Timeouts,
        max_tokens: int | None,
    ) -> UpstreamResponse:
        resp = await super().send(client, endpoint, body, model, headers, timeouts, max_tokens)
        if one_tool_call(body):  # no switch for it in Gemini's API: the answer is cut
            resp.body = first_tool_call_only(resp.body)
        return resp

    def response(self, endpoint: str, body: bytes, model: str) -> bytes:
        try:
            return orjson.dumps(gemini_to_chat(orjson.loads(body), model))
        except (orjson.JSONDecodeError, BadAnswer) as e:
            raise InvalidAnswer(f"not a generateContent answer: {e}") from None

    def stream(self, endpoint: str, body: dict[str, Any], model: str) -> StreamTranslator:
        n = body.get("n")
        state = GeminiStream(
            model,
            include_usage=wants_usage(body),
            candidates=n if isinstance(n, int) and n > 1 else 1,
            max_event=self.config.limits.max_event_bytes,
            single_call=one_tool_call(body),
        )

        def translate(data: bytes) -> bytes:
            try:
                return state.feed(data)
            except StreamError as e:
                if e.kind == "bad_response":
                    raise InvalidAnswer(e.detail) from None
                raise UpstreamFailure(e.kind, e.detail, body=e.body) from None
            except ValueError as e:  # an event over the size limit
                raise InvalidAnswer(str(e)) from None

        return translate
