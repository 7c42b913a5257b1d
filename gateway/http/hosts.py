"""The names the gateway answers to: `Host` parsing, loopback names, GATEWAY_ALLOWED_HOSTS.

A web page whose domain an attacker re-points to 127.0.0.1 (DNS rebinding) is, to the browser,
the same origin as the gateway; only its `Host` header, which still names the attacker's domain,
tells it apart. These helpers read that header (bounded: no value can make them slow or raise)
and the operator's list of the names the gateway is reached by.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping

ALLOWED_HOSTS_ENV = "GATEWAY_ALLOWED_HOSTS"

# 253 for a DNS name, plus a port and brackets; anything longer names no host we serve.
MAX_HOST_BYTES = 300
# DNS labels as hosts use them (the underscore appears in container and service names).
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")


class HostsConfigError(ValueError):
    """GATEWAY_ALLOWED_HOSTS holds an entry that names no host: the gateway does not start."""


def host_name(value: bytes) -> str | None:
    """The host name a `Host` value addresses: lower case, port, IPv6 brackets and one trailing
    dot removed. None for anything that is not a host name or an IP literal (too long, odd
    bytes, a bad port, an unclosed bracket)."""
    if len(value) > MAX_HOST_BYTES:
        return None
    try:
        text = value.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        name, rest = text[1:end], text[end + 1 :]
        if rest and not (rest.startswith(":") and _PORT.fullmatch(rest[1:])):
            return None
        return name if _ipv6(name) else None
    if text.count(":") == 1:
        text, port = text.split(":")
        if not _PORT.fullmatch(port):
            return None
    elif ":" in text:
        return text if _ipv6(text) else None  # a bare IPv6 literal (not valid HTTP, but clear)
    if text.endswith("."):
        text = text[:-1]
    return text if _dns_name(text) else None


def loopback_name(name: str) -> bool:
    """Whether a parsed host name is this machine's loopback: `localhost` (or a name under it),
    127.0.0.0/8 or ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class AllowedHosts:
    """The names of GATEWAY_ALLOWED_HOSTS: exact names, IP literals and `*.domain` wildcards
    (any name under the domain, not the domain itself). Loopback names are always allowed: no
    re-pointed domain can send one, and local tools (the admin CLI) use them."""

    def __init__(self, entries: list[str]) -> None:
        self.exact: frozenset[str] = frozenset(e for e in entries if not e.startswith("*."))
        self.suffixes: tuple[str, ...] = tuple(e[1:] for e in entries if e.startswith("*."))

    def __bool__(self) -> bool:
        return bool(self.exact or self.suffixes)

    def allows(self, name: str | None) -> bool:
        if name is None:
            return False
        return name in self.exact or name.endswith(self.suffixes) or loopback_name(name)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AllowedHosts:
        """Parse the variable; unset or blank = no list (every name is served).

        Raises HostsConfigError naming the first entry that is no host name: a typo must not
        leave the gateway refusing its real name, or serving every name, without saying so."""
        env = os.environ if env is None else env
        raw = env.get(ALLOWED_HOSTS_ENV, "")
        if not raw.strip():
            return cls([])
        entries = []
        for i, item in enumerate(raw.split(",")):
            entry = _entry(item.strip())
            if entry is None:
                raise HostsConfigError(
                    f"{ALLOWED_HOSTS_ENV} entry {i + 1} ({item.strip()[:80]!r}) is not a host "
                    "name: use names like api.example.com, *.example.com or an IP address, "
                    "without scheme, port or path, separated by commas"
                )
            entries.append(entry)
        return cls(entries)


def _entry(item: str) -> str | None:
    """An entry of the list in its compared form, or None when it names no host."""
    item = item.lower()
    if item.startswith("*."):
        rest = item[2:].removesuffix(".")
        return "*." + rest if "*" not in rest and _dns_name(rest) else None
    if item.startswith("[") and item.endswith("]") and _ipv6(item[1:-1]):
        return item[1:-1]
    if _ipv6(item):
        return item
    item = item.removesuffix(".")
    return item if _dns_name(item) else None


def _dns_name(text: str) -> bool:
    if not text or len(text) > 253:
        return False
    return all(_LABEL.fullmatch(label) for label in text.split("."))


def _ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False
