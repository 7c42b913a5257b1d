"""Load and validate policy files, with `${ENV}` interpolation and readable errors."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.policy.schema import ENV_REF, Policy


class PolicyError(Exception):
    """A policy that cannot be used. `problems` holds one "field.path: message" line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid policy {source}:\n  " + "\n  ".join(problems))


def _interpolate(node: Any, path: str, env: Mapping[str, str], problems: list[str]) -> Any:
    if isinstance(node, str):

        def repl(m: Any) -> str:
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return str(default)
            problems.append(f"{path or '<root>'}: environment variable {name} is not set")
            return ""

        return ENV_REF.sub(repl, node)
    if isinstance(node, dict):
        return {
            k: _interpolate(v, f"{path}.{k}" if path else str(k), env, problems)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_interpolate(v, f"{path}.{i}", env, problems) for i, v in enumerate(node)]
    return node


def _format_validation(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # Cross-reference errors already carry their own paths.
            if e["loc"] == ():
                lines.extend(part.strip() for part in msg.split(";"))
                continue
        lines.append(f"{loc}: {msg}")
    return lines


def parse_policy(
    text: str, source: str = "<string>", env: Mapping[str, str] | None = None
) -> Policy:
    """Parse YAML text into a validated Policy or raise PolicyError listing every problem."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(source, [f"<yaml>: {e}"]) from None
    if not isinstance(raw, dict):
        raise PolicyError(source, ["<root>: a policy file must be a mapping"])
    problems: list[str] = []
    data = _interpolate(raw, "", os.environ if env is None else env, problems)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        problems.extend(_format_validation(e))
        raise PolicyError(source, problems) from None
    if problems:
        raise PolicyError(source, problems)
    return policy


def load_policy(path: str | Path, env: Mapping[str, str] | None = None) -> Policy:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(str(p), [f"<file>: {e.strerror or e}"]) from None
    return parse_policy(text, str(p), env)


def policy_fingerprint(policy: Policy) -> str:
    """A short, stable version id of a policy (shown by /admin and in logs)."""
    return hashlib.sha256(policy.model_dump_json().encode()).hexdigest()[:12]
