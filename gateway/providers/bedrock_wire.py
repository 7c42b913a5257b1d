"""Bedrock's wire: SigV4 signing and AWS event stream decoding, both done by botocore.

botocore is an optional dependency (the `aws` extra): it is imported on first use, and a policy
with a `bedrock` provider is refused at load time with a clear message when it is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any
from urllib.parse import quote

import orjson

SERVICE = "bedrock"
EVENT_STREAM = "application/vnd.amazon.eventstream"
MISSING = "provider type 'bedrock' needs botocore: pip install 'llm-gateway[aws]' (or pip install botocore)"


def botocore_modules() -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    """(auth, awsrequest, credentials, eventstream); RuntimeError naming the extra if missing."""
    try:
        from botocore import auth, awsrequest, credentials, eventstream
    except ImportError as e:
        raise RuntimeError(MISSING) from e
    return auth, awsrequest, credentials, eventstream


def operation_path(model_id: str, stream: bool) -> str:
    """`/model/{modelId}/converse[-stream]`, the model id percent-encoded as botocore does
    (an inference profile ARN or a `...-v1:0` id holds `:` and `/`)."""
    return f"/model/{quote(model_id, safe='')}/{'converse-stream' if stream else 'converse'}"


class Signer:
    """Signs one request with SigV4 (botocore's SigV4Auth) for service `bedrock`."""

    def __init__(
        self, access_key_id: str, secret_access_key: str, session_token: str | None, region: str
    ) -> None:
        auth, awsrequest, credentials, _ = botocore_modules()
        self._creds = credentials.Credentials(access_key_id, secret_access_key, session_token)
        self._auth = auth.SigV4Auth(self._creds, SERVICE, region)
        self._request = awsrequest.AWSRequest
        self.region = region

    def headers(
        self, url: str, body: bytes, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The headers to send with a POST of `body` to `url`: content type, X-Amz-Date,
        Authorization (and X-Amz-Security-Token for temporary credentials).

        `url` must be sent exactly as given (already percent-encoded): the signature covers it.
        """
        request = self._request(
            method="POST",
            url=url,
            data=body,
            headers={"content-type": "application/json", **(extra or {})},
        )
        self._auth.add_auth(request)
        return dict(request.headers.items())


class DecodeError(ValueError):
    """Bytes that are not a valid AWS event stream (bad CRC, lengths, or payload)."""


class EventDecoder:
    """AWS event stream bytes -> (event type, JSON payload, is an exception) per message."""

    def __init__(self) -> None:
        eventstream = botocore_modules()[3]
        self._buffer = eventstream.EventStreamBuffer()
        self._errors: tuple[type[BaseException], ...] = (eventstream.ParserError,)

    def feed(self, data: bytes) -> list[tuple[str, Any, bool]]:
        self._buffer.add_data(data)
        out: list[tuple[str, Any, bool]] = []
        try:
            for message in self._buffer:
                headers = message.headers
                kind = headers.get(":message-type")
                if kind == "exception":
                    name = headers.get(":exception-type") or "internalServerException"
                    out.append((str(name), _json(message.payload), True))
                elif kind == "error":  # a protocol-level error message
                    name = headers.get(":error-code") or "internalServerException"
                    out.append((str(name), {"message": headers.get(":error-message")}, True))
                else:
                    out.append(
                        (str(headers.get(":event-type") or ""), _json(message.payload), False)
                    )
        except self._errors as e:
            raise DecodeError(f"not an AWS event stream: {type(e).__name__}") from None
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished message held (bounded by the caller's event size limit)."""
        return len(self._buffer._data)


def _json(payload: bytes) -> Any:
    try:
        return orjson.loads(payload) if payload else {}
    except orjson.JSONDecodeError:
        raise DecodeError("an event payload is not JSON") from None
