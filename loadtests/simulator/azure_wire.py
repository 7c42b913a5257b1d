"""An instance behind Azure OpenAI's URLs and auth, for adapter tests.

Azure's wire format is OpenAI's; what differs is checked before the request reaches the
instance's OpenAI endpoints: the path (`/openai/deployments/{deployment}/{endpoint}` or the v1
surface `/openai/v1/{endpoint}`), the `api-version` query (required on deployment URLs, a date
such as 2024-10-21 or 2025-01-01-preview), the key (`api-key` header; v1 also takes
`Authorization: Bearer`) and the deployment (one of the profile's models). A wrong one gets
Azure's answer (400, 401 or 404 `DeploymentNotFound`), so an adapter bug fails a test.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import orjson

from .http import Connection, Request

if TYPE_CHECKING:
    from .server import Instance

_DEPLOYMENT = re.compile(
    rb"^/openai/deployments/([A-Za-z0-9._-]+)/(chat/completions|completions|embeddings)$"
)
_V1 = re.compile(rb"^/openai/v1/(chat/completions|completions|embeddings)$")
_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")


def _error(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


class AzureWire:
    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.last_path: bytes | None = None  # for tests: what the adapter called...
        self.last_body: bytes | None = None  # ...and sent

    async def handle(self, req: Request, conn: Connection) -> None:
        inst = self.inst
        self.last_path = req.path + (b"?" + req.query if req.query else b"")
        self.last_body = req.body
        deployment = _DEPLOYMENT.match(req.path)
        v1 = _V1.match(req.path)
        if deployment is None and v1 is None:
            conn.send(404, _error("404", "Resource not found"))
            return
        query = parse_qs(req.query.decode("latin-1"))
        versions = query.get("api-version", [])
        if deployment is not None and not versions:
            conn.send(400, _error("BadRequest", "Missing required query parameter: api-version"))
            return
        if versions and not (
            _API_VERSION.match(versions[0]) or (v1 and versions[0] in ("preview", "latest"))
        ):
            conn.send(400, _error("BadRequest", f"API version not supported: {versions[0]}"))
            return
        key = inst.spec.api_key
        if key is not None:
            ok = req.headers.get(b"api-key") == key.encode()
            if v1 is not None:
                ok = ok or req.headers.get(b"authorization") == b"Bearer " + key.encode()
            if not ok:
                conn.send(
                    401,
                    _error(
                        "401",
                        "Access denied due to invalid subscription key or wrong API endpoint.",
                    ),
                )
                return
        if deployment is not None:
            name, endpoint = deployment.group(1).decode(), deployment.group(2)
        else:
            endpoint = v1.group(1)  # type: ignore[union-attr]
            try:
                model = orjson.loads(req.body).get("model")
            except (orjson.JSONDecodeError, AttributeError):
                model = None
            name = model if isinstance(model, str) else ""
        if name not in inst.profile.models:
            conn.send(
                404, _error("DeploymentNotFound", f"The API deployment {name} does not exist.")
            )
            return
        headers = dict(req.headers)
        if inst.auth is not None:
            headers[b"authorization"] = inst.auth
        native = Request(req.method, b"/v1/" + endpoint, headers, req.body, req.keep_alive)
        await inst.handle(native, conn, native=True)
