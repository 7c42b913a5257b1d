"""The provider adapter interface and the registry of adapters by policy `type:`.

Inside, the gateway speaks OpenAI: chat completions, completions and embeddings, their chunks
and their errors. An adapter maps one provider's wire format onto that, in four places:

- the request: path (with query), per-request headers and body (`request`), plus the headers
  every request carries, auth included (`session_headers`);
- the unary answer, into an OpenAI chat completion with usage (`response`);
- the stream, provider events into OpenAI chunks ending with `[DONE]` (`stream`), after the
  transport has checked the stream's start (`is_stream`, `first_event_complete`);
- errors, into the gateway's failure kinds (`failure`), with the body rewritten into OpenAI's
  error shape so that the pass-through of a 4xx and the context-overflow rewrite see one shape.

The failover stage talks to every provider through two calls, `send` (unary) and `open_stream`;
what they do by default is the mapping above. An adapter whose provider speaks OpenAI as it is
sets `passthrough = True`: the client's body then goes out with only the model replaced and the
answer bytes come back untouched (the hot path, no copy). Adding an adapter: subclass `Adapter`, decorate it with `@register`, import
its module in gateway/providers/__init__.py and add its name to `settings.ProviderType`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from gateway.policy.schema import Provider, Timeouts
from gateway.providers.upstream import (
    OpenAIWire,
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
    UpstreamStream,
)
from gateway.wire.answer_checks import InvalidAnswer, flatten_content
from gateway.wire.request import PATHS

JSON_HEADERS = {"content-type": "application/json"}


@dataclass(slots=True)
class UpstreamRequest:
    """What to send for one attempt."""

    path: str  # appended to the provider's base_url; may carry a query string
    body: bytes
    headers: dict[str, str] | None = None  # per request (e.g. a signature), over the session's


# Raw provider stream bytes in, OpenAI SSE bytes out (possibly empty: nothing complete yet).
# Stateful, one per stream; raises InvalidAnswer or UpstreamFailure on a bad or error event.
StreamTranslator = Callable[[bytes], bytes]


class UnsupportedEndpoint(UpstreamFailure):
    """The member's provider type cannot serve this endpoint: another member may."""

    def __init__(self, provider_type: str, endpoint: str) -> None:
        super().__init__("unsupported", f"a {provider_type} provider does not serve {endpoint}")


class Adapter(OpenAIWire):
    """Maps one provider type's wire format to and from the gateway's OpenAI shapes."""

    type: ClassVar[str] = ""
    # Speaks OpenAI as it is: `request`/`response`/`stream` are never called (the fast path).
    passthrough: ClassVar[bool] = False
    # The gateway endpoints this provider type can serve ("chat", "completions", "embeddings").
    endpoints: ClassVar[frozenset[str]] = frozenset({"chat"})
    # `request` paths are percent-encoded already (and signed as sent): not re-normalised.
    encoded_paths: ClassVar[bool] = False

    # -- transport hooks (gateway.providers.upstream.UpstreamClient): OpenAIWire's unless overridden --
    # session_headers(), auth_headers(), failure(), is_stream(), first_event_complete()

    def secrets(self) -> list[str]:
        """Credential values beyond `api_key` and headers (e.g. a signing secret): masked by
        the redactor wherever text could carry them."""
        return []

    # -- the two calls the failover stage makes ----------------------------------------------

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
        """One unary attempt: the answer as OpenAI JSON bytes (`model`: the provider's id)."""
        if self.passthrough:
            raw = _with_model(body, model)
            resp = await client.send(PATHS[endpoint], raw, headers, timeouts, max_tokens)
            # Content-part lists (Mistral, reasoning servers) as the string clients read.
            resp.body = flatten_content(endpoint, resp.body)
            return resp
        if not self.supports(endpoint):
            raise UnsupportedEndpoint(self.type, endpoint)
        req = self.request(endpoint, body, model, False)
        if req.headers:
            headers = {**headers, **req.headers} if headers else req.headers
        resp = await client.send(req.path, req.body, headers, timeouts, max_tokens)
        try:
            resp.body = self.response(endpoint, resp.body, model)
        except InvalidAnswer as e:
            raise UpstreamFailure("bad_response", str(e)) from None
        except _MAPPING_ERRORS as e:
            # JSON of the right outer shape with a value of the wrong type inside (a list for a
            # stop reason, a string for an object): the answer is broken, not the gateway.
            raise UpstreamFailure("bad_response", _unreadable(e)) from None
        return resp

    async def open_stream(
        self,
        client: UpstreamClient,
        endpoint: str,
        body: dict[str, Any],
        model: str,
        headers: dict[str, str] | None,
        timeouts: Timeouts,
    ) -> UpstreamStream:
        """One streamed attempt, open once its first event arrived; events as OpenAI chunks."""
        if self.passthrough:
            return await client.open_stream(
                PATHS[endpoint], _with_model(body, model), headers, timeouts
            )
        if not self.supports(endpoint):
            raise UnsupportedEndpoint(self.type, endpoint)
        req = self.request(endpoint, body, model, True)
        if req.headers:
            headers = {**headers, **req.headers} if headers else req.headers
        translate = self.stream(endpoint, body, model)
        if translate is not None:
            translate = _guarded(translate)
        return await client.open_stream(req.path, req.body, headers, timeouts, translate)

    # -- mapping hooks (the default `send` and `open_stream`) --------------------------------

    def supports(self, endpoint: str) -> bool:
        return endpoint in self.endpoints

    def request(
        self, endpoint: str, body: dict[str, Any], model: str, stream: bool
    ) -> UpstreamRequest:
        """The provider request for an OpenAI-shaped body; `model` is the provider's model id."""
        raise NotImplementedError

    def response(self, endpoint: str, body: bytes, model: str) -> bytes:
        """The provider's unary answer as OpenAI JSON bytes (`model`: the provider model id
        the request named); raises InvalidAnswer."""
        raise NotImplementedError

    def stream(self, endpoint: str, body: dict[str, Any], model: str) -> StreamTranslator | None:
        """A translator for one stream of this request (`body` is the OpenAI request); None
        when the provider's events are OpenAI chunks already."""
        raise NotImplementedError


# What mapping code raises on a provider answer holding values of the wrong types.
_MAPPING_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError)


def _unreadable(e: BaseException) -> str:
    return f"the answer holds a value of the wrong type ({type(e).__name__})"


def _guarded(translate: StreamTranslator) -> StreamTranslator:
    """A stream translator whose mapping errors on a malformed event are a bad answer
    (InvalidAnswer: retried before the first byte, an error event after), like the checks'."""

    def guarded(raw: bytes) -> bytes:
        try:
            return translate(raw)
        except _MAPPING_ERRORS as e:
            raise InvalidAnswer(_unreadable(e)) from None

    return guarded


def _with_model(body: dict[str, Any], model: str) -> bytes:
    """The client's body with the provider's model id (no copy when they are the same)."""
    if model != body["model"]:
        body = {**body, "model": model}
    return orjson.dumps(body)


ADAPTERS: dict[str, type[Adapter]] = {}


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: make `cls` the adapter of providers with `type: cls.type`."""
    if not cls.type or cls.type in ADAPTERS:
        raise ValueError(f"adapter type '{cls.type}' is empty or registered twice")
    ADAPTERS[cls.type] = cls
    return cls


def make_adapter(config: Provider, api_key: str | None) -> Adapter:
    """The adapter for a provider's configured type."""
    return ADAPTERS[config.type](config, api_key)
