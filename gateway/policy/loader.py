"""Load and validate policy files, with `${ENV}` interpolation and readable errors.

Every problem is reported with its field path and line (`models.chat.routes.interactve: unknown
class 'interactve' (line 42)`). Errors refuse the policy; warnings (a provider key variable that
is unset, a class rule naming a tenant no key maps to) are reported and the policy is used.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.policy.crosscheck import (
    Problem,
    number_problems,
    raw_number_problems,
    reference_problems,
)
from gateway.policy.rules import check_rules
from gateway.policy.schema import ENV_REF, GATEWAY_ENV_PREFIX, SKIP_REFERENCES, Policy
from gateway.policy.source import (
    SourceMap,
    YamlLimitError,
    load_yaml,
    lone_surrogate,
    read_bounded,
)

# Variables a policy may never read: the gateway's own secrets.
SECRET_VARIABLES = frozenset({"GATEWAY_ADMIN_KEY", "GATEWAY_API_KEYS"})


# Line breaks and other control characters: a value quoted in a problem (a key, a name, an
# interpolated variable) must not start a line of its own in `policy check` output or the log.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160))}
_CONTROL.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(text: str) -> str:
    """`text` with control characters written as escapes: one line, whatever a value held."""
    return text.translate(_CONTROL)


class PolicyError(Exception):
    """A policy that cannot be used. `problems` holds one "field.path: message (line N)" each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid policy {source}:\n  " + "\n  ".join(problems))


@dataclass(slots=True)
class PolicyReport:
    """What checking a policy found: the policy (None when refused), errors and warnings."""

    source: str
    policy: Policy | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class _Problems:
    def __init__(self, smap: SourceMap) -> None:
        self.smap = smap
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.error_paths: set[str] = set()

    def _fmt(self, path: str, message: str, at: str | None, line: int | None) -> str:
        at = path if at is None else at
        if line is None:
            line = self.smap.line_of(at) if at and at != "<root>" else None
        where = f" (line {line})" if line else ""
        return one_line(f"{path or '<root>'}: {message}{where}")

    def error(
        self, path: str, message: str, at: str | None = None, line: int | None = None
    ) -> None:
        self.error_paths.add(path)
        self.errors.append(self._fmt(path, message, at, line))

    def warn(self, path: str, message: str, at: str | None = None) -> None:
        self.warnings.append(self._fmt(path, message, at, None))

    def add(self, problem: Problem) -> None:
        if problem.warning:
            self.warn(problem.path, problem.message, problem.at)
        else:
            self.error(problem.path, problem.message, problem.at)


def _secret_names(raw: dict[str, Any]) -> set[str]:
    """Variables holding gateway keys: a policy may name them only as auth.keys[].key_env."""
    names = set(SECRET_VARIABLES)
    keys = (raw.get("auth") or {}).get("keys") if isinstance(raw.get("auth"), dict) else None
    for k in keys if isinstance(keys, list) else []:
        if isinstance(k, dict) and isinstance(k.get("key_env"), str):
            names.add(k["key_env"])
    return names


def _provider_key_names(raw: dict[str, Any]) -> set[str]:
    """Variables named as provider keys (`api_key_env`): interpolated only under `providers.`,
    where they go upstream; anywhere else (an alias's `owned_by`, a template) they would be
    shown to clients."""
    providers = raw.get("providers")
    names: set[str] = set()
    for p in providers.values() if isinstance(providers, dict) else []:
        if isinstance(p, dict) and isinstance(p.get("api_key_env"), str):
            names.add(p["api_key_env"])
    return names


def _interpolate(
    node: Any,
    path: str,
    env: Mapping[str, str],
    problems: _Problems,
    secrets: set[str],
    provider_keys: frozenset[str] = frozenset(),
    used: set[str] | None = None,
    prefixes: tuple[str, ...] = (),
) -> Any:
    """`prefixes`: provider_key_env_prefixes; variables in provider headers must start with one
    (when any is given), like api_key_env."""
    if isinstance(node, str):

        def repl(m: Any) -> str:
            name, default = m.group(1), m.group(2)
            if name in secrets:
                problems.error(path, f"${{{name}}} holds a gateway key and may not be used here")
                return ""
            if name in provider_keys and not path.startswith("providers."):
                problems.error(
                    path, f"${{{name}}} holds a provider key: only providers.* may use it"
                )
                return ""
            if used is not None and name in env:
                used.add(name)
            upstream = path.startswith("providers.") and ".headers." in path
            if upstream and name.upper().startswith(GATEWAY_ENV_PREFIX):
                problems.error(path, f"${{{name}}}: GATEWAY_* variables are never sent upstream")
                return ""
            if upstream and prefixes and not name.startswith(prefixes):
                # Documented, and not enforced: any variable (AWS_SECRET_ACCESS_KEY...) went out.
                problems.error(
                    path,
                    f"${{{name}}} does not start with an allowed prefix "
                    f"({', '.join(prefixes)}): only those variables are sent upstream",
                )
                return ""
            if name in env:
                bad = lone_surrogate(env[name])
                if bad is not None:  # bytes that are not UTF-8 (read as surrogate escapes)
                    problems.error(path, f"environment variable {name} is not UTF-8 text")
                    return ""
                return env[name]
            if default is not None:
                return str(default)
            if upstream:  # a provider credential: like an unset api_key_env, only a warning
                problems.warn(path, f"environment variable {name} is not set: sent empty")
                return ""
            problems.error(path, f"environment variable {name} is not set")
            return ""

        if "${" in ENV_REF.sub(lambda m: "${" if "${" in (m.group(2) or "") else "", node):
            # Unclosed, nested (${A:-${B}}) or shell forms (${A-x}, ${A:=x}) were kept as
            # literal text: a model id or header value "${B}" sent upstream.
            problems.error(
                path,
                "holds a '${' that is not a variable reference: write ${VAR} or "
                "${VAR:-default} (no nesting)",
            )
        return ENV_REF.sub(repl, node)
    if isinstance(node, dict):
        return {
            k: _interpolate(
                v,
                f"{path}.{k}" if path else str(k),
                env,
                problems,
                secrets,
                provider_keys,
                used,
                prefixes,
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [
            _interpolate(v, f"{path}.{i}", env, problems, secrets, provider_keys, used, prefixes)
            for i, v in enumerate(node)
        ]
    return node


def _validation_problems(err: ValidationError, problems: _Problems) -> None:
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # Cross-reference errors already carry their own paths ("path: message; ...").
            if e["loc"] == ():
                for part in msg.split("; "):
                    path, _, text = part.strip().partition(": ")
                    problems.error(path, text)
                continue
        problems.error(loc, msg)


def _items(node: Any, key: str) -> list[tuple[str, Any]]:
    """(name or index, value) of a mapping or list found under `key` of a raw dict."""
    value = node.get(key) if isinstance(node, dict) else None
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, list):
        return [(str(i), v) for i, v in enumerate(value)]
    return []


def _bedrock_env_checks(
    pname: str, p: dict[str, Any], env: Mapping[str, str], problems: _Problems
) -> None:
    """A bedrock provider's credentials and region: unset ones are warnings like api_key_env."""
    from gateway.providers.settings import BedrockSettings, bedrock_region

    raw: dict[str, Any] = p["bedrock"] if isinstance(p.get("bedrock"), dict) else {}
    try:
        settings = BedrockSettings(**raw)
    except (TypeError, ValueError):
        return  # the schema reports it with its path
    for setting in ("access_key_id_env", "secret_access_key_env"):
        name = getattr(settings, setting)
        if not env.get(name):
            problems.warn(
                f"providers.{pname}.bedrock.{setting}",
                f"environment variable {name} is not set: Bedrock will refuse '{pname}'",
            )
    base_url: str = p["base_url"] if isinstance(p.get("base_url"), str) else ""
    if bedrock_region(base_url, settings, env) is None:
        problems.warn(
            f"providers.{pname}.bedrock.region",
            f"no region (bedrock.region, the base_url host or {settings.region_env}): "
            f"requests to '{pname}' are signed for us-east-1",
        )


def _env_checks(data: dict[str, Any], env: Mapping[str, str], problems: _Problems) -> None:
    """Variables the policy names (checked on the raw data, so they are reported even when the
    policy has other errors): a gateway key source must yield a key, else the gateway would be
    open; a missing provider key is only a warning (some upstreams need none)."""
    tenants: set[str] = set()
    for i, k in _items(data.get("auth"), "keys"):
        if not isinstance(k, dict):
            continue
        tenants.add(str(k.get("tenant")))
        name = k.get("key_env")
        if isinstance(name, str) and not env.get(name, "").strip():
            problems.error(
                f"auth.keys.{i}.key_env",
                f"environment variable {name} is unset or empty: tenant '{k.get('tenant')}' "
                "would have no key",
            )
    for pname, p in _items(data, "providers"):
        if isinstance(p, dict) and p.get("type") == "bedrock":
            _bedrock_env_checks(pname, p, env, problems)
        name = p.get("api_key_env") if isinstance(p, dict) else None
        if isinstance(name, str) and name and not env.get(name):
            problems.warn(
                f"providers.{pname}.api_key_env",
                f"environment variable {name} is not set: requests to '{pname}' are sent "
                "without a key",
            )
    if tenants and not env.get("GATEWAY_API_KEYS"):
        for i, rule in _items(data, "classes"):
            for j, t in _items(rule, "tenants"):
                if t not in tenants:
                    problems.warn(f"classes.{i}.tenants.{j}", f"no gateway key maps to '{t}'")


def check_policy(
    text: str, source: str = "<string>", env: Mapping[str, str] | None = None
) -> PolicyReport:
    """Parse and validate YAML text; every error and warning with its field path and line."""
    env = os.environ if env is None else env
    try:
        raw, smap = load_yaml(text)
    except yaml.YAMLError as e:
        return PolicyReport(source, None, [f"{source}: invalid YAML: {e}"])
    except YamlLimitError as e:
        return PolicyReport(source, None, [f"{source}: refused: {e}"])
    problems = _Problems(smap)
    if not isinstance(raw, dict):
        return PolicyReport(source, None, [f"{source}: a policy file must be a mapping"])
    for d in smap.duplicates:
        # PyYAML keeps the last value silently: a second block would replace the first unseen.
        problems.error(d.path, f"duplicate key (first given on line {d.first_line})", line=d.line)
    used: set[str] = set()
    keys = frozenset(_provider_key_names(raw))
    given = raw.get("provider_key_env_prefixes")
    prefixes = (
        tuple(p for p in given if isinstance(p, str) and p) if isinstance(given, list) else ()
    )
    data = _interpolate(raw, "", env, problems, _secret_names(raw), keys, used, prefixes)
    policy: Policy | None = None
    try:
        policy = Policy.model_validate(data, context={SKIP_REFERENCES: True})
        # The values this policy took from the environment: masked in every admin view of it
        # (read from the policy in force, not from the file on disk, which may have moved on).
        policy._interpolated = tuple(env[name] for name in sorted(used))
    except ValidationError as e:
        _validation_problems(e, problems)
    # On the plain document: reported even when a field above failed validation.
    for p in reference_problems(data):
        problems.add(p)
    found = number_problems(policy) if policy is not None else raw_number_problems(data)
    for p in found:
        if p.path not in problems.error_paths:  # pydantic may have refused the same value
            problems.add(p)
    _env_checks(data, env, problems)
    if problems.errors:
        policy = None
    return PolicyReport(source, policy, problems.errors, problems.warnings)


def check_policy_file(
    path: str | Path, env: Mapping[str, str] | None = None, text: str | None = None
) -> PolicyReport:
    """The full check of a policy file, as `gateway policy check`, start-up and every reload run
    it: the policy itself and the degradation rules files it names. `text`: the file's text when
    the caller has read it already (a reload hashes the very text it checked)."""
    if text is None:
        try:
            text = read_policy_text(path)
        except PolicyError as e:
            return PolicyReport(str(path), None, e.problems)
    report = check_policy(text, str(path), env)
    if report.policy is not None:
        errors, warnings = check_rules(report.policy, path)
        report.errors.extend(errors)
        report.warnings.extend(warnings)
        if errors:
            report.policy = None
    return report


def parse_policy(
    text: str, source: str = "<string>", env: Mapping[str, str] | None = None
) -> Policy:
    """Parse YAML text into a validated Policy or raise PolicyError listing every problem."""
    report = check_policy(text, source, env)
    if report.policy is None:
        raise PolicyError(source, report.errors)
    return report.policy


def read_policy_text(path: str | Path) -> str:
    """The text of a policy file, read with a bound (a device or a FIFO is refused, never read
    without end or waited on)."""
    p = Path(path)
    try:
        return read_bounded(p).decode("utf-8")
    except YamlLimitError as e:
        raise PolicyError(str(p), [f"{p}: refused: {e}"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(str(p), [f"{p}: {getattr(e, 'strerror', None) or e}"]) from None


def load_policy(path: str | Path, env: Mapping[str, str] | None = None) -> Policy:
    """A policy file that passes the full check (rules files included), else PolicyError."""
    report = check_policy_file(path, env)
    if report.policy is None:
        raise PolicyError(str(path), report.errors)
    return report.policy


def text_hash(text: str) -> str:
    """The SHA-256 of a policy file's text: what replicas compare on a reload signal."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def policy_fingerprint(policy: Policy) -> str:
    """A short, stable version id of a policy (shown by /admin and in logs)."""
    return hashlib.sha256(policy.model_dump_json().encode()).hexdigest()[:12]
