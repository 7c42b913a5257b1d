"""`type: azure`: Azure OpenAI. The wire format is OpenAI's; the URL and the auth differ.

- `surface: deployments` (classic): `{base_url}/openai/deployments/{deployment}/{endpoint}
  ?api-version=...`, the deployment being the member's model mapping (`models:`);
- `surface: v1`: `{base_url}/openai/v1/{endpoint}` with the model in the body.

The key goes in the `api-key` header (or `Authorization: Bearer` for an Entra ID token).
Answers, streams and errors are OpenAI's (`DeploymentNotFound` is a 404: upstream_auth;
`context_length_exceeded` keeps its code), so they are relayed without mapping.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

import orjson

from gateway.policy.schema import Provider
from gateway.providers.base import Adapter, StreamTranslator, UpstreamRequest, register
from gateway.providers.settings import AzureSettings
from gateway.wire.answer_checks import flatten_content

_ENDPOINT_PATHS = {
    "chat": "chat/completions",
    "completions": "completions",
    "embeddings": "embeddings",
}


@register
class AzureAdapter(Adapter):
    type: ClassVar[str] = "azure"
    endpoints: ClassVar[frozenset[str]] = frozenset(_ENDPOINT_PATHS)

    def __init__(self, config: Provider, api_key: str | None) -> None:
        super().__init__(config, api_key)
        self.settings = config.azure or AzureSettings()
        s = self.settings
        # v1 takes no api-version unless one was set explicitly (preview features).
        send_version = s.surface == "deployments" or "api_version" in s.model_fields_set
        self._query = f"?api-version={quote(s.api_version)}" if send_version else ""
        self._paths: dict[tuple[str, str], str] = {}  # (endpoint, model) -> path, built once

    def auth_headers(self) -> dict[str, str]:
        if not self.api_key:
            return {}
        if self.settings.auth == "bearer":
            return {"authorization": f"Bearer {self.api_key}"}
        return {"api-key": self.api_key}

    def _path(self, endpoint: str, model: str) -> str:
        path = self._paths.get((endpoint, model))
        if path is None:
            tail = _ENDPOINT_PATHS[endpoint]
            if self.settings.surface == "deployments":
                path = f"/openai/deployments/{quote(model, safe='')}/{tail}{self._query}"
            else:
                path = f"/openai/v1/{tail}{self._query}"
            if len(self._paths) < 1024:
                self._paths[(endpoint, model)] = path
        return path

    def request(
        self, endpoint: str, body: dict[str, Any], model: str, stream: bool
    ) -> UpstreamRequest:
        if body.get("model") != model:
            body = {**body, "model": model}
        return UpstreamRequest(self._path(endpoint, model), orjson.dumps(body))

    def response(self, endpoint: str, body: bytes, model: str) -> bytes:
        # OpenAI's shape already (checked by the dispatcher like any answer); content-part
        # lists (models of other vendors served by Azure) as the string clients read.
        return flatten_content(endpoint, body)

    def stream(self, endpoint: str, body: dict[str, Any], model: str) -> StreamTranslator | None:
        return None  # OpenAI chunks already
