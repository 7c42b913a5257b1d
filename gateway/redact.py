"""Secrets never reach a client: redaction of provider keys, sanitised upstream error messages.

Three tools, one concern:

* :class:`Redactor` replaces the gateway's own provider secrets (API keys, configured header
  values, passwords in base URLs) wherever they appear in an upstream body or stream event it
  relays, in any case. It searches byte strings in the lower-cased answer: cheap enough for
  every relayed event.
* :func:`sanitize_message` cleans an upstream error message before it is re-wrapped in the
  gateway's own error: besides the secrets, anything that looks like a bearer token or an API key,
  URLs and internal host names go. It runs on error paths only.
* :func:`redacted_dump` is the policy as the admin API shows it: header values and URL
  credentials masked, every known secret value replaced.
"""

from __future__ import annotations

import base64
import re
import string
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import orjson

MASK = "[redacted]"
_MASK_B = MASK.encode()
# Shorter values are not treated as secrets: masking them would garble ordinary text.
MIN_SECRET_LEN = 8
MAX_MESSAGE_CHARS = 500


class Redactor:
    """Replaces known secret values in relayed bytes and texts.

    Besides whole values, :meth:`fragments` masks a secret's first or last `MIN_SECRET_LEN`+
    characters standing alone: a stream may cut a key between two events, and each event is
    redacted on its own.
    """

    __slots__ = (
        "_bytes",
        "_edges",
        "_encoded",
        "_encoded_bytes",
        "_given",
        "_low_edges",
        "_texts",
    )

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, all kept: a key that begins with another key (two keys of one
        # account) is masked whole, not left with its tail after the shorter one's mask.
        given = {s for s in secrets if s and len(s) >= MIN_SECRET_LEN}
        self._given = tuple(given)
        # Every plain spelling: as configured, URL-quoted (`/`, `+`, `=` of a base64 key as
        # `%2F`..., as an answer quoting a request URL shows it) and hexadecimal; with the
        # characters of its public prefix and how many spell one of the key's. Kept lower-cased
        # and looked for in lower-cased bytes and text: one search finds a spelling in any case
        # (a key upper-cased, or capitalised at the start of a sentence).
        forms: dict[str, tuple[int, int]] = {}
        for s in given:
            for v in (s, *url_forms(s)):
                forms.setdefault(v.lower(), (public_prefix_len(v), 1))
            forms.setdefault(hex_form(s), (2 * public_prefix_len(s), 2))
        values = sorted(forms, key=len)[::-1]
        self._texts = tuple(values)
        self._bytes = tuple(v.encode() for v in values)
        # Each spelling's shortest start and end that count as part of it: once, per policy.
        self._edges = tuple(edges(v.encode(), *forms[v]) for v in values)
        self._low_edges = tuple({e: None for pair in self._edges for e in pair})
        # An upstream may quote a key base64-encoded (an echoed `Basic` credential, a
        # decoded-then-re-encoded header): masked in error messages (`text`), whole unary
        # answers (`json`) and stream events (`encoded`, and the stream's text guard, which
        # finds them cut between events like the plain forms).
        self._encoded = tuple(sorted({c for s in given for c in base64_cores(s)}, key=len)[::-1])
        self._encoded_bytes = tuple(c.encode() for c in self._encoded)

    def extended(self, more: Iterable[str]) -> Redactor:
        return Redactor((*self._given, *more))

    @property
    def secret_texts(self) -> tuple[str, ...]:
        """Every plain spelling, lower-cased (to look for in `ascii_lower` text), longest first."""
        return self._texts

    @property
    def encoded_texts(self) -> tuple[str, ...]:
        """Every secret's base64 spellings (`base64_cores`), longest first."""
        return self._encoded

    @property
    def encoded_bytes(self) -> tuple[bytes, ...]:
        return self._encoded_bytes

    def may_hold(self, data: bytes) -> bool:
        """Whether `data` may hold a secret or part of one: a spelling's `edges` (in any case)
        or a base64 spelling. False is certain; True sends it to the masking (`bytes`...)."""
        low = data.lower()
        for edge in self._low_edges:
            if edge in low:
                return True
        for s in self._encoded_bytes:  # noqa: SIM110 (a loop, not any(): per event)
            if s in data:
                return True
        return False

    def __bool__(self) -> bool:
        return bool(self._bytes)

    def mask(self, data: bytes) -> bytes:
        """`data` with every spelling of a secret masked: plain ones whole, then their leading
        or trailing parts (a stream cut between events), then base64 ones."""
        return self.encoded(self.fragments(self.plain(data)))

    def plain(self, data: bytes) -> bytes:
        """`data` with every plain spelling of a secret masked, in any case."""
        low = data.lower()  # byte for byte: positions in it are positions in `data`
        spans = [span for s in self._bytes for span in _find_all(low, s)]
        return _mask_spans(data, spans, _MASK_B)

    def encoded(self, data: bytes) -> bytes:
        """`data` with every secret's base64 spellings masked."""
        for s in self._encoded_bytes:
            if s in data:
                data = data.replace(s, _MASK_B)
        return data

    def text(self, text: str) -> str:
        """`text` with every secret masked: its plain spellings in any case, base64 as it is."""
        low = ascii_lower(text)
        text = _mask_spans(text, [span for s in self._texts for span in _find_all(low, s)], MASK)
        for s in self._encoded:
            if s in text:
                text = text.replace(s, MASK)
        return text

    def json(self, body: bytes, doc: Any) -> bytes:
        """`body` (the JSON text of `doc`) redacted: whole secrets, a secret's leading or
        trailing part, its base64 spellings, and secrets hidden by escapes (`\\u0073k-...`, `\\/` in a base64
        value: the body is then read as the decoded text). Where anything was masked, the
        answer's `logprobs` go too: their tokens spell the same text in pieces."""
        plain = orjson.dumps(doc) if has_escapes(body) else body
        if not self.may_hold(plain):
            return body
        masked = self.mask(plain)
        if masked == plain:
            return body
        if b'"logprobs"' in masked:
            redacted = orjson.loads(masked)
            for choice in redacted.get("choices") or []:
                if isinstance(choice, dict) and choice.get("logprobs") is not None:
                    choice["logprobs"] = None
            return orjson.dumps(redacted)
        return masked

    def fragments(self, data: bytes) -> bytes:
        """`data` with every secret's leading or trailing run of `MIN_SECRET_LEN` or more
        characters masked, in any case (whole secrets are assumed replaced already)."""
        low = data.lower()
        spans = []
        for s, (head, tail) in zip(self._bytes, self._edges, strict=True):
            spans += _edge_spans(low, s, head, tail)
        return _mask_spans(data, spans, _MASK_B)

    def text_fragments(self, text: str) -> str:
        """:meth:`fragments` for text; also masks any run of `MIN_SECRET_LEN` characters or
        more from inside a secret (error paths only: a key quoted without its prefix)."""
        # Plain spellings in any case (one search of the lower-cased text), base64 as it is.
        low = ascii_lower(text)
        spans = [span for s in self._texts for span in _run_spans(low, s)]
        spans += [span for s in self._encoded for span in _run_spans(text, s)]
        return _mask_spans(text, spans, MASK)


def hex_form(secret: str) -> str:
    """`secret`'s bytes in hexadecimal (a key dumped as bytes; upper-case digits are the same
    spelling to the case-blind search)."""
    return secret.encode("utf-8", "surrogatepass").hex()


def url_forms(secret: str) -> set[str]:
    """`secret` percent-encoded as URL encoders write it (upper and lower case hex), when that
    differs from the secret itself."""
    out = set()
    for safe in ("", "/"):
        q = quote(secret, safe=safe)
        if q != secret:
            out |= {q, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), q)}
    return out


def base64_cores(secret: str) -> set[str]:
    """The characters that spell `secret` in base64 (standard and URL-safe alphabets) whatever
    bytes come before or after it: one core per alignment of its first byte in a 3-byte group
    (`user:KEY` encodes KEY at another alignment than `KEY` alone). Cores shorter than
    `MIN_SECRET_LEN` are left out, like short secrets."""
    raw = secret.encode("utf-8", "surrogatepass")
    out: set[str] = set()
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw).decode()
        # Characters wholly inside the secret's bits: after the k lead bytes, before the end.
        core = encoded[(8 * k + 5) // 6 : (8 * (k + len(raw))) // 6]
        if len(core) >= MIN_SECRET_LEN:
            out |= {core, core.translate(_URLSAFE)}
    return out


_URLSAFE = str.maketrans("+/", "-_")


def unquoted(text: str) -> str:
    """`text` with its percent-escapes decoded, up to three times over (a key quoted in a URL
    that was quoted again): every way of spelling a character in a URL is one spelling here."""
    for _ in range(3):
        if "%" not in text:
            break
        decoded = unquote(text, errors="replace")
        if decoded == text:
            break
        text = decoded
    return text


def has_escapes(data: bytes) -> bool:
    """Whether JSON text holds escapes that can hide a secret's characters (`\\uXXXX`, `\\/`;
    a quote, a backslash or a control character is in no secret)."""
    return b"\\u" in data or b"\\/" in data


# A vendor's key prefix (`sk-`, `sk-proj-`, `sk-ant-api03-`): public, in every key of that
# vendor and in documentation; a fragment of a key counts only past it.
_PUBLIC_PREFIX = re.compile(r"[A-Za-z]{1,8}(?:[-_][A-Za-z0-9]{1,8}){0,2}[-_]")


def public_prefix_len(secret: str | bytes) -> int:
    """Characters of `secret`'s public vendor prefix (0 when it has none)."""
    text = secret.decode("latin-1") if isinstance(secret, bytes) else secret
    m = _PUBLIC_PREFIX.match(text)
    return m.end() if m is not None and len(text) - m.end() >= MIN_SECRET_LEN else 0


def edges(secret: bytes, public: int | None = None, width: int = 1) -> tuple[bytes, bytes]:
    """The shortest start and end of `secret` that count as part of it: its public prefix and
    8 more characters, its last 8. `width` characters spell one of the key's (2 in hex)."""
    if public is None:
        public = public_prefix_len(secret)
    return secret[: public + width * MIN_SECRET_LEN], secret[-width * MIN_SECRET_LEN :]


def _find_all(data: Any, needle: Any) -> list[tuple[int, int]]:
    """Every place `needle` stands in `data` (overlapping ones too)."""
    spans = []
    pos = data.find(needle)
    while pos >= 0:
        spans.append((pos, pos + len(needle)))
        pos = data.find(needle, pos + 1)
    return spans


def _edge_spans(data: bytes, secret: bytes, head: bytes, tail: bytes) -> list[tuple[int, int]]:
    """Maximal runs of `data` that are a prefix or a suffix of `secret`, at least as long as
    its `edges` (a run of a key's public prefix alone, "sk-proj-", stays)."""
    n = len(tail)
    if head not in data and tail not in data:
        return []
    spans: list[tuple[int, int]] = []
    pos = data.find(head)
    while pos >= 0:
        end = pos + len(head)
        while end < len(data) and end - pos < len(secret) and data[end] == secret[end - pos]:
            end += 1
        spans.append((pos, end))
        pos = data.find(head, end)
    pos = data.find(tail)
    while pos >= 0:
        start, k = pos, len(secret) - n  # data[pos:pos+n] == secret[k:]
        while start > 0 and k > 0 and data[start - 1] == secret[k - 1]:
            start, k = start - 1, k - 1
        spans.append((start, pos + n))
        pos = data.find(tail, pos + 1)
    return spans


def _run_spans(text: str, secret: str) -> list[tuple[int, int]]:
    """Where `text` holds runs of MIN_SECRET_LEN+ characters found anywhere in `secret`."""
    n = MIN_SECRET_LEN
    spans: list[tuple[int, int]] = []
    for i in range(len(secret) - n + 1):
        window = secret[i : i + n]
        pos = text.find(window)
        while pos >= 0:
            spans.append((pos, pos + n))
            pos = text.find(window, pos + 1)
    return spans


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def ascii_lower(text: str) -> str:
    """`text` lower-cased, character for character (positions in it are positions in `text`)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def _mask_spans(data: Any, spans: list[tuple[int, int]], mask: Any) -> Any:
    """`data` with the union of `spans` replaced, one mask per merged run."""
    if not spans:
        return data
    spans.sort()
    out, last = [], 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s <= end:
            end = max(end, e)
            continue
        out += [data[last:start], mask]
        last, (start, end) = end, (s, e)
    out += [data[last:start], mask, data[end:]]
    return data[:0].join(out)


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


# Header names that carry credentials. Other configured headers (`HTTP-Referer`, `X-Title`,
# `anthropic-version`) are not secrets: masking their values garbled ordinary text ("2023-06-01",
# every "https://" when a referer was configured).
_SECRET_HEADER = re.compile(
    r"(?i)auth|key|token|secret|password|passwd|cookie|credential|signature"
)


def provider_secrets(base_url: str, headers: dict[str, str], api_key: str | None) -> list[str]:
    """Every secret value a provider's configuration holds."""
    out = [api_key] if api_key else []
    for name, value in headers.items():
        scheme, _, token = value.partition(" ")
        bearer = bool(token) and scheme.lower() in ("bearer", "basic", "token")
        # By the header's name only: a long value of another header (a preview URL in a
        # referer, `anthropic-beta: token-efficient-tools-2025-02-19`) is not a credential,
        # and masking it garbled every "https://" of every answer.
        if bearer or _SECRET_HEADER.search(name):
            out.append(value)
        if bearer:
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
# A credential in a URL's query, however the URL is written (`?key=AIza...` in Gemini's errors,
# `&sig=`, `&X-Amz-Signature=`): the value goes, the parameter's name stays.
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:[a-z0-9_\-]*?(?:key|token|secret|sig|signature|password|passwd|pwd|auth|"
    r"credential))=)[^&\s\"'#<>]+"
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
    # Read as decoded: a key quoted percent-encoded (`sk%2Dabc...`, `%73%6B...`) is the key.
    text = unquoted(message[: MAX_MESSAGE_CHARS * 4])
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)
    if redactor is not None:
        text = redactor.text_fragments(redactor.text(text))
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


def secret_like(value: str, redactor: Redactor | None) -> bool:
    """Whether a short upstream token (an error's type, code or param) holds a secret, part of
    one, or anything shaped like a credential: such a token is dropped, not relayed."""
    value = unquoted(value)
    if redactor is not None and redactor.text_fragments(redactor.text(value)) != value:
        return True
    return bool(_KEYLIKE.search(value) or _BEARER.search(value) or _QUERY_SECRET.search(value))


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
