"""OpenAI-shaped errors.

Every error a client can receive goes through `GatewayError` so that the body always has the
`{"error": {"message", "type", "param", "code"}}` shape the OpenAI SDKs parse, and never leaks an
upstream URL or key.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

JSON_MEDIA = "application/json"


class GatewayError(Exception):
    """An error answered to the client with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def to_response(self, extra_headers: dict[str, str] | None = None) -> Response:
        headers = dict(self.headers)
        if extra_headers:
            headers.update(extra_headers)
        return Response(
            self.to_bytes(), status_code=self.status, media_type=JSON_MEDIA, headers=headers
        )


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unauthorized(message: str = "Invalid or missing API key.") -> GatewayError:
    return GatewayError(401, message, type="invalid_request_error", code="invalid_api_key")


def not_found(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(404, message, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    return not_found(
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"Request body is larger than the limit of {limit} bytes.", code="request_too_large"
    )


def upstream_error(status: int, message: str, code: str) -> GatewayError:
    """502/503/504: the message names the failure kind, never the upstream's address."""
    return GatewayError(status, message, type="upstream_error", code=code)


def internal_error() -> GatewayError:
    return GatewayError(
        500, "The gateway hit an internal error.", type="server_error", code="internal_error"
    )
