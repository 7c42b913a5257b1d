"""The `bedrock` adapter: Amazon Bedrock's Converse / ConverseStream API, signed with SigV4.

Credentials come from the environment variables the policy names (`bedrock:` section, AWS's
usual names by default), read when the policy is applied; every attempt is signed with
botocore's SigV4 signer. The translation itself is in bedrock_mapping (pure functions), the
signing and event stream decoding in bedrock_wire.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.policy.schema import Timeouts
from gateway.providers.base import (
    JSON_HEADERS,
    Adapter,
    StreamTranslator,
    UpstreamRequest,
    register,
)
from gateway.providers.bedrock_mapping import (
    BadAnswer,
    StreamError,
    TranslationError,
    chat_to_converse,
    converse_to_chat,
    map_error,
)
from gateway.providers.bedrock_mapping import StreamTranslator as EventTranslator
from gateway.providers.bedrock_wire import (
    EVENT_STREAM,
    DecodeError,
    EventDecoder,
    Signer,
    operation_path,
)
from gateway.providers.common import first_tool_call_only, one_tool_call
from gateway.providers.settings import BedrockSettings, bedrock_region
from gateway.providers.upstream import (
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
    forwardable_headers,
    parse_retry_after,
)
from gateway.wire.answer_checks import InvalidAnswer

_PRELUDE = 12  # total length, headers length, prelude CRC


@register
class BedrockAdapter(Adapter):
    type = "bedrock"
    endpoints = frozenset({"chat"})
    encoded_paths = True  # a model id's ':' travels as %3A, as SigV4 signed it

    def __init__(self, config: Any, api_key: str | None) -> None:
        super().__init__(config, api_key)
        settings: BedrockSettings = config.bedrock or BedrockSettings()
        self.settings = settings
        env = os.environ
        self._secret = env.get(settings.secret_access_key_env, "")
        self._token = env.get(settings.session_token_env or "", "") or None
        # No region anywhere: the loader warned; us-east-1 is what AWS's own tools fall back to.
        region = bedrock_region(config.base_url, settings, env) or "us-east-1"
        self._signer = Signer(
            env.get(settings.access_key_id_env, ""), self._secret, self._token, region
        )
        self._base = config.base_url.rstrip("/")
        self._max_event = config.limits.max_event_bytes

    def secrets(self) -> list[str]:
        """Credential values the redactor masks (never in a log or an error)."""
        return [s for s in (self._secret, self._token) if s]

    # -- transport ---------------------------------------------------------------------------

    def session_headers(self) -> dict[str, str]:
        # No auth header here: each request carries its own signature.
        return {**JSON_HEADERS, **self.config.headers}

    def failure(
        self, status: int, body: bytes, headers: Mapping[str, str], ratelimit: bool
    ) -> UpstreamFailure:
        mapped = map_error(status, headers, body)
        retry = parse_retry_after(headers.get("retry-after"))
        return UpstreamFailure(
            mapped.kind,
            f"provider answered {status} {mapped.exception}".rstrip(),
            status=mapped.status,
            body=mapped.body,
            headers=forwardable_headers(headers, ratelimit),
            retry_after=retry if mapped.kind == "rate_limited" else None,
        )

    def is_stream(self, content_type: str | None) -> bool:
        return bool(content_type) and content_type.split(";")[0].strip().lower() == EVENT_STREAM  # type: ignore[union-attr]

    def first_event_complete(self, buf: bytes) -> bool:
        """Whether the first event stream message is whole (its CRCs are checked on decoding)."""
        if len(buf) < _PRELUDE:
            return False
        total = int.from_bytes(buf[:4], "big")
        if total < _PRELUDE + 4 or total > self._max_event:
            raise InvalidAnswer("the stream is not an AWS event stream of bounded messages")
        return len(buf) >= total

    # -- mapping -----------------------------------------------------------------------------

    def request(
        self, endpoint: str, body: dict[str, Any], model: str, stream: bool
    ) -> UpstreamRequest:
        try:
            converse = chat_to_converse(body)
        except TranslationError as e:
            # A request this type cannot express: another member (of another type) may serve it.
            raise UpstreamFailure("unsupported", f"bedrock: {e}") from None
        if self.settings.cache_system_prompt and converse.get("system"):
            converse["system"].append({"cachePoint": {"type": "default"}})
        data = orjson.dumps(converse)
        path = operation_path(model, stream)
        return UpstreamRequest(path, data, self._signer.headers(self._base + path, data))

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
        if one_tool_call(body):  # no switch for it in Converse: the answer is cut
            resp.body = first_tool_call_only(resp.body)
        return resp

    def response(self, endpoint: str, body: bytes, model: str) -> bytes:
        try:
            answer = orjson.loads(body)
            return orjson.dumps(converse_to_chat(answer, model))
        except (orjson.JSONDecodeError, BadAnswer) as e:
            raise InvalidAnswer(f"not a Converse answer: {e}") from None

    def stream(self, endpoint: str, body: dict[str, Any], model: str) -> StreamTranslator:
        decoder = EventDecoder()
        opts = body.get("stream_options")
        include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        events = EventTranslator(
            model, include_usage=include_usage, single_call=one_tool_call(body)
        )
        limit = self._max_event

        def translate(data: bytes) -> bytes:
            try:
                out = [
                    sse
                    for kind, payload, exception in decoder.feed(data)
                    for sse in events.feed(kind, payload, exception)
                ]
            except DecodeError as e:
                raise InvalidAnswer(str(e)) from None
            except StreamError as e:
                status = 429 if e.kind == "rate_limited" else None
                raise UpstreamFailure(e.kind, e.detail, status=status, body=e.body) from None
            if decoder.pending_bytes > limit:
                raise InvalidAnswer(f"stream event larger than {limit} bytes")
            return b"".join(out)

        return translate
