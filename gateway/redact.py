"""Secrets never reach a client: redaction of provider keys, sanitised upstream error messages.

Three tools, one concern:

* :class:`Redactor` replaces the gateway's own provider secrets (API keys, configured header
  values, passwords in base URLs) wherever they appear in an upstream body or stream event it
  relays. It matches exact byte strings: cheap enough for every relayed event.
* :func:`sanitize_message` cleans an upstream error message before it is re-wrapped in the
  gateway's own error: besides the secrets, anything that looks like a bearer token or an API key,
  URLs and internal host names go. It runs on error paths only.
* :func:`redacted_dump` is the policy as the admin API shows it: header values and URL
  credentials masked, every known secret value replaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "[redacted]"
_MASK_B = MASK.encode()
# Shorter values are not treated as secrets: masking them would garble ordinary text.
MIN_SECRET_LEN = 8
MAX_MESSAGE_CHARS = 500


class Redactor:
    """Replaces known secret values in relayed bytes and texts."""

    __slots__ = ("_bytes", "_texts")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values: list[str] = []
        # Shortest first: a value that contains another one (`Bearer <key>`) needs no search.
        for s in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LEN}, key=len):
            if not any(v in s for v in values):
                values.append(s)
        self._texts = tuple(values)
        self._bytes = tuple(v.encode() for v in values)

    def extended(self, more: Iterable[str]) -> Redactor:
        return Redactor((*self._texts, *more))

    @property
    def secret_bytes(self) -> tuple[bytes, ...]:
        return self._bytes

    def __bool__(self) -> bool:
        return bool(self._bytes)

    def bytes(self, data: bytes) -> bytes:
        for s in self._bytes:
            if s in data:
                data = data.replace(s, _MASK_B)
        return data

    def text(self, text: str) -> str:
        for s in self._texts:
            if s in text:
                text = text.replace(s, MASK)
        return text


def url_secrets(url: str) -> list[str]:
    """Credentials a URL carries: user info and query values (e.g. `?api-key=`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    out = [v for v in (parts.username, parts.password) if v]
    out.extend(v for _, v in parse_qsl(parts.query))
    return out


def strip_url_credentials(url: str) -> str:
    """The URL with its password and query values masked (the admin view of a base URL)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if parts.password is not None or parts.username is not None:
        host = netloc.rsplit("@", 1)[1]
        netloc = f"{MASK}@{host}"
    query = "&".join(f"{k}={MASK}" for k, _ in parse_qsl(parts.query))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def provider_secrets(base_url: str, headers: dict[str, str], api_key: str | None) -> list[str]:
    """Every secret value a provider's configuration holds."""
    out = [api_key] if api_key else []
    for value in headers.values():
        out.append(value)
        scheme, _, token = value.partition(" ")
        if token and scheme.lower() in ("bearer", "basic", "token"):
            out.append(token)
    out.extend(url_secrets(base_url))
    return [s for s in out if s]


# Looks like a credential: a bearer token, a vendor key (`sk-...`, masked `sk-...****abcd` too),
# a JWT, or a long opaque token.
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)\s+[^\s\"',;]+")
_KEYLIKE = re.compile(
    r"\b(?:sk|pk|rk|gsk|hf|fw|xai|key|api[-_]?key|AIza)[-_][A-Za-z0-9*._\-]{4,}"
    r"|\beyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"
    r"|\b[A-Za-z0-9_\-]{32,}\b"
)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s\"'<>)]+")
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b|\[[0-9a-fA-F:]+\](?::\d{1,5})?")
_HOST = re.compile(
    r"\b[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*"
    r"(?:\.(?:internal|local|localdomain|lan|corp|intra|svc|cluster\.local|home\.arpa)\b(?::\d{1,5})?"
    r"|:\d{2,5}\b)"
)


def sanitize_message(message: str, redactor: Redactor | None, hosts: Iterable[str] = ()) -> str:
    """An upstream message fit for a client: no secret, token, key, URL or internal host."""
    text = message[: MAX_MESSAGE_CHARS * 4]
    if redactor is not None:
        text = redactor.text(text)
    text = _URL.sub("[url]", text)
    for host in hosts:
        if host:
            text = text.replace(host, "[host]")
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _KEYLIKE.sub(MASK, text)
    text = _IP.sub("[host]", text)
    text = _HOST.sub("[host]", text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "..."
    return text


def redacted_dump(doc: Any, redactor: Redactor) -> Any:
    """A JSON-able policy dump with provider header values, URL credentials and secrets masked."""
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            if k == "headers" and isinstance(v, dict):
                out[k] = {name: MASK for name in v}
            else:
                out[k] = redacted_dump(v, redactor)
        return out
    if isinstance(doc, list):
        return [redacted_dump(v, redactor) for v in doc]
    if isinstance(doc, str):
        if "://" in doc:
            doc = strip_url_credentials(doc) if url_secrets(doc) else doc
        return redactor.text(doc)
    return doc
