"""Checks across fields of a policy: names that must exist elsewhere, fallback loops, and numbers
no setting can sensibly hold.

The reference checks read the plain document (the YAML after `${ENV}` interpolation), not the
validated model, so that `gateway policy check` reports them even when a field elsewhere failed
validation: one run lists every problem. `Policy` runs the same function on itself when built
directly. The number checks walk every numeric field of every settings model in the policy, so a
setting added to any part's model is covered without being named here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from gateway.governance.settings import Governance

YEAR_S = 366 * 86_400
# No count, size, rate, weight or amount of money in a policy needs more; beyond it sums and
# products at run time may overflow to inf, and integers past 64 bits cannot be written as JSON.
MAX_NUMBER = 1e12
# Names of policy entries (as schema.Name): what a header value and a metrics label can carry.
NAME = re.compile(r"[A-Za-z0-9_.:/@+-]{1,128}")


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: `path` is shown, the line is that of `at` (default: `path`)."""

    path: str
    message: str
    warning: bool = False
    at: str | None = None


def _mapping(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _strings(value: Any) -> list[tuple[int, str]]:
    return (
        [(i, v) for i, v in enumerate(value) if isinstance(v, str)]
        if isinstance(value, list)
        else []
    )


def reference_problems(data: Mapping[str, Any]) -> list[Problem]:
    """Every reference between sections that does not hold, on the plain document. Entries of the
    wrong shape are skipped: field validation reports those."""
    out: list[Problem] = []
    providers = _mapping(data.get("providers"))
    pools = _mapping(data.get("pools"))
    models = _mapping(data.get("models"))
    classes = (
        [c if isinstance(c, Mapping) else {} for c in data.get("classes") or []]
        if isinstance(data.get("classes"), list)
        else []
    )

    names = [str(c["name"]) for c in classes if isinstance(c.get("name"), str)]
    for i, c in enumerate(classes):
        name = c.get("name")
        if isinstance(name, str) and name and not NAME.fullmatch(name):
            # The class is sent in the x-gateway-class header and labels metrics: a name a
            # header cannot carry failed every request of the class with a 500.
            out.append(
                Problem(
                    f"classes.{i}.name",
                    "must be 1-128 characters of A-Z a-z 0-9 _ . : / @ + - (it is sent in the "
                    "x-gateway-class header)",
                )
            )
    if len(set(names)) != len(names):
        out.append(Problem("classes", "class names must be unique"))
    given = data.get("default_class", "default")
    default_class = given if isinstance(given, str) else "default"  # else a field error
    known_classes = {*names, default_class}
    routed = {
        str(cls) for alias in models.values() for cls in _mapping(_mapping(alias).get("routes"))
    }
    if (
        "default_class" in data
        and names
        and default_class not in names
        and default_class not in routed
    ):
        out.append(
            Problem(
                "default_class",
                f"'{default_class}' is neither a class in classes nor routed by any model "
                f"(classes: {', '.join(names)})",
            )
        )
    for i, rule in enumerate(classes):
        for j, a in _strings(rule.get("aliases")):
            if a not in models:
                out.append(Problem(f"classes.{i}.aliases.{j}", f"unknown model '{a}'"))

    prefixes = tuple(p for _, p in _strings(data.get("provider_key_env_prefixes")))
    for pname, provider in providers.items():
        env = _mapping(provider).get("api_key_env")
        if isinstance(env, str) and env and prefixes and not env.startswith(prefixes):
            out.append(
                Problem(
                    f"providers.{pname}.api_key_env",
                    f"'{env}' does not start with an allowed prefix ({', '.join(prefixes)})",
                )
            )

    for pname, provider in providers.items():
        out.extend(_timeout_warnings(pname, _mapping(_mapping(provider).get("timeouts"))))
    retry_deadline = _mapping(data.get("retry")).get("deadline_s")
    out.extend(_deadline_warnings(retry_deadline, providers))
    out.extend(_model_deadline_warnings(retry_deadline, models, pools, providers))

    for pname, pool in pools.items():
        pool = _mapping(pool)
        for i, m in _strings(pool.get("members")):
            if m not in providers:
                out.append(
                    Problem(
                        f"pools.{pname}.members",
                        f"unknown provider '{m}'",
                        at=f"pools.{pname}.members.{i}",
                    )
                )
        for i, f in _strings(pool.get("fallback")):
            at = f"pools.{pname}.fallback.{i}"
            if f == pname:
                out.append(
                    Problem(f"pools.{pname}.fallback", "a pool cannot fall back to itself", at=at)
                )
            elif f not in pools:
                out.append(Problem(f"pools.{pname}.fallback", f"unknown pool '{f}'", at=at))
    out.extend(_fallback_cycles(pools))

    for aname, alias in models.items():
        alias = _mapping(alias)
        pool = alias.get("pool")
        if isinstance(pool, str) and pool not in pools:
            out.append(Problem(f"models.{aname}.pool", f"unknown pool '{pool}'"))
        for cls, target in _mapping(alias.get("routes")).items():
            if isinstance(target, str) and target not in pools:
                out.append(Problem(f"models.{aname}.routes.{cls}", f"unknown pool '{target}'"))
            if cls not in known_classes:
                out.append(
                    Problem(
                        f"models.{aname}.routes.{cls}",
                        f"unknown class '{cls}' (classes: {', '.join(sorted(map(str, known_classes)))})",
                    )
                )
        out.extend(_alias_fallback(aname, alias, models))
        window, expected = alias.get("context_window"), alias.get("default_max_tokens")
        if isinstance(window, int) and isinstance(expected, int) and 0 < window < expected:
            # Both given: the expected output alone overflows the window.
            out.append(
                Problem(
                    f"models.{aname}.context_window",
                    f"{window} tokens is less than default_max_tokens ({expected}): the expected "
                    "output alone does not fit",
                )
            )

    gov = data.get("governance")
    try:
        governance = Governance.model_validate(gov if gov is not None else {})
    except ValidationError:
        governance = None  # field validation reports it
    if governance is not None:
        for text in governance.reference_errors(set(pools)):
            path, _, message = text.partition(": ")
            out.append(Problem(path, message))
    return out


def _timeout_warnings(pname: str, timeouts: dict[str, Any]) -> list[Problem]:
    """Limits given longer than the whole attempt never fire (total_s ends it first)."""
    total = timeouts.get("total_s")
    if not isinstance(total, int | float) or isinstance(total, bool):
        return []
    out = []
    for part in ("connect_s", "idle_s"):
        limit = timeouts.get(part)
        if isinstance(limit, int | float) and not isinstance(limit, bool) and limit > total:
            out.append(
                Problem(
                    f"providers.{pname}.timeouts.{part}",
                    f"{limit:g} s is longer than total_s ({total:g}): it never applies",
                    warning=True,
                )
            )
    return out


def _number(value: Any) -> float | None:
    """A number given in the document (a boolean is not one), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _deadline_warnings(deadline: Any, providers: dict[str, Any]) -> list[Problem]:
    """A member's first_byte_s (given) beyond the request deadline never applies: a member that
    slow is cut by the deadline (a 504) instead of failing over to the next one."""
    deadline = _number(deadline)
    if deadline is None:
        return []
    return [
        Problem(
            f"providers.{pname}.timeouts.first_byte_s",
            f"{first:g} s is longer than retry.deadline_s ({deadline:g}): it never "
            "applies, a member that slow is cut by the deadline instead of failed over",
            warning=True,
        )
        for pname, first in _slower_than(deadline, providers, providers)
    ]


def _slower_than(
    deadline: float, names: Iterable[str], providers: dict[str, Any]
) -> list[tuple[str, float]]:
    """The named providers whose given first_byte_s is beyond `deadline`, with it."""
    out = []
    for name in names:
        timeouts = _mapping(_mapping(providers.get(name)).get("timeouts"))
        first = _number(timeouts.get("first_byte_s"))
        if first is not None and first > deadline:
            out.append((name, first))
    return out


def _model_deadline_warnings(
    retry_deadline: Any, models: dict[str, Any], pools: dict[str, Any], providers: dict[str, Any]
) -> list[Problem]:
    """A model's deadline that the policy's (shorter) always overrules never applies; a member
    of the model's pools whose first_byte_s (given) is beyond it is cut instead of failed over."""
    out = []
    overall = _number(retry_deadline)
    for name, alias in models.items():
        alias = _mapping(alias)
        deadline = _number(alias.get("deadline_s"))
        if deadline is None:
            continue
        path = f"models.{name}.deadline_s"
        if overall is not None and deadline >= overall:
            out.append(
                Problem(
                    path,
                    f"{deadline:g} s is not shorter than retry.deadline_s ({overall:g}): "
                    "it never applies",
                    warning=True,
                )
            )
            continue
        named = [alias.get("pool"), *_mapping(alias.get("routes")).values()]
        members = {
            m
            for p in named
            if isinstance(p, str)
            for _, m in _strings(_mapping(pools.get(p)).get("members"))
        }
        out.extend(
            Problem(
                path,
                f"{deadline:g} s is shorter than member {m}'s first_byte_s ({first:g}): "
                "a member that slow is cut by the deadline instead of failed over",
                warning=True,
            )
            for m, first in _slower_than(deadline, sorted(members), providers)
        )
    return out


def _fallback_cycles(pools: dict[str, Any]) -> list[Problem]:
    """Pools that come back to themselves through other pools' fallbacks. The router tries each
    pool once, so the loop is cut: a warning (a pool naming itself is an error above)."""
    edges = {
        name: [f for _, f in _strings(_mapping(p).get("fallback")) if f in pools and f != name]
        for name, p in pools.items()
    }
    out: list[Problem] = []
    reported: set[frozenset[str]] = set()
    for start in pools:
        path = _path_back(start, edges)
        if path is None or frozenset(path) in reported:
            continue
        reported.add(frozenset(path))
        loop = " -> ".join([*path, start])
        out.append(
            Problem(
                f"pools.{start}.fallback",
                f"fallbacks loop back to this pool ({loop}); each pool is tried once",
                warning=True,
            )
        )
    return out


def _path_back(start: str, edges: dict[str, list[str]]) -> list[str] | None:
    """The shortest path start -> ... -> start of two or more pools, or None."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for f in edges.get(node, []):
                if f == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if f not in previous:
                    previous[f] = node
                    nxt.append(f)
        frontier = nxt
    return None


def _alias_fallback(aname: str, alias: dict[str, Any], models: dict[str, Any]) -> list[Problem]:
    """fallback_alias: an existing alias other than itself; following it should lead somewhere
    with a larger context window, not back to the start."""
    target = alias.get("fallback_alias")
    path = f"models.{aname}.fallback_alias"
    if not isinstance(target, str):
        return []
    if target == aname:
        return [Problem(path, "an alias cannot fall back to itself")]
    if target not in models:
        return [Problem(path, f"unknown alias '{target}'")]
    seen = [aname, target]
    nxt = _mapping(models[target]).get("fallback_alias")
    while isinstance(nxt, str) and nxt in models and nxt not in seen:
        seen.append(nxt)
        nxt = _mapping(models[nxt]).get("fallback_alias")
    if nxt == aname:
        loop = " -> ".join([*seen, aname])
        return [
            Problem(
                path,
                f"fallback aliases loop back to this alias ({loop}); a prompt too long for all "
                "of them is refused",
                warning=True,
            )
        ]
    own, other = alias.get("context_window"), _mapping(models[target]).get("context_window")
    if isinstance(own, int) and isinstance(other, int) and other <= own:
        return [
            Problem(
                path,
                f"'{target}' has a context window of {other} tokens, not more than this alias's "
                f"{own}: prompts too long here are too long there too",
                warning=True,
            )
        ]
    return []


# ---- numbers --------------------------------------------------------------------------------


def _number_problem(name: str, value: float) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, not {value}"
    limit = YEAR_S * 1000 if name.endswith("_ms") else YEAR_S if name.endswith("_s") else None
    if limit is not None and value > limit:
        unit = "ms" if name.endswith("_ms") else "s"
        return f"{value:g} {unit} is longer than a year: not a usable duration"
    if abs(value) > MAX_NUMBER:
        # Integers too: one beyond 64 bits cannot be written as JSON (admin views, explain).
        shown = f"{value:g}" if isinstance(value, float) else _int_text(value)
        return f"{shown} is larger than {MAX_NUMBER:g}: not a usable setting"
    return None


def _int_text(value: int) -> str:
    """A large integer in a few characters (float() overflows past 1e308)."""
    digits = str(abs(value))
    sign = "-" if value < 0 else ""
    if len(digits) <= 15:
        return sign + digits
    return f"{sign}{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"


def number_problems(model: BaseModel) -> list[Problem]:
    """Every numeric field of `model` and the models inside it: finite, durations (`*_s`,
    `*_ms`, TTLs included) at most a year, any other number at most MAX_NUMBER."""
    out: list[Problem] = []

    def walk(value: Any, name: str, path: str) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int | float):
            problem = _number_problem(name, value)
            if problem:
                out.append(Problem(path, problem))
        elif isinstance(value, BaseModel):
            for field in type(value).model_fields:
                walk(getattr(value, field), field, f"{path}.{field}" if path else field)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, name, f"{path}.{k}")
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(v, name, f"{path}.{i}")

    walk(model, "", "")
    return out


def raw_number_problems(data: Any, path: str = "") -> list[Problem]:
    """Non-finite numbers (`.inf`, `.nan`) in the plain document: reported even when the policy
    failed validation elsewhere."""
    out: list[Problem] = []
    if isinstance(data, float) and not math.isfinite(data):
        out.append(Problem(path or "<root>", f"must be a finite number, not {data}"))
    elif isinstance(data, Mapping):
        for k, v in data.items():
            out.extend(raw_number_problems(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(raw_number_problems(v, f"{path}.{i}" if path else str(i)))
    return out
