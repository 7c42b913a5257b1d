"""Degradation rule files as validated data: their schema, loading and the checks a policy runs on
the rules it names (`gateway policy check`, start-up and every reload run the same ones).

The answering side (rendering, hot reload of the folder) is gateway.resilience.degrade_rules; the
files are read here, in the policy layer, so that a policy is only accepted with rules that load.
Every problem names the file, the field and its line.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.policy.source import SourceMap, YamlLimitError, load_yaml, read_bounded

if TYPE_CHECKING:
    from gateway.policy.schema import Policy

try:  # the regex parser, to refuse patterns that backtrack exponentially
    from re import _parser as _sre  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse as _sre  # type: ignore[no-redef]

PLACEHOLDERS = frozenset({"alias", "model", "request_id", "retry_after_s", "tenant", "class"})
# A regex runs on at most this many characters of the message: even a pattern that passed the
# nested-quantifier check may backtrack polynomially, and a client chooses the text.
MAX_REGEX_INPUT = 8192
MAX_REGEX_CHARS = 1000
MAX_RETRY_AFTER_S = 86_400.0


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file, the field path and its line."""

    def __init__(
        self,
        file: str,
        field_path: str,
        problem: str,
        line: int | None = None,
        more: tuple[str, ...] = (),
    ) -> None:
        """`more`: further problems of the same file, each "path: problem (line N)"."""
        self.file, self.field_path, self.problem, self.line = file, field_path, problem, line
        self.more = more
        where = f"{file}: {field_path}" if field_path else file
        at = f" (line {line})" if line is not None else ""
        super().__init__(f"{where}: {problem}{at}" + "".join(f"; {m}" for m in more))


def _casefold_all(values: list[str]) -> list[str]:
    return [v.casefold() for v in values]


def backtracking_problem(pattern: str) -> str | None:
    """Why `pattern` may backtrack exponentially, or None: a repeated group that holds an
    unbounded repeat (`(a+)+`, `(a*)*`, `(\\w+\\s?)+`), or that holds alternatives able to
    start the same way (`(a|aa)*`, `(a|a)+`). A heuristic on literal characters: it finds the
    usual shapes, not every one (the regex also runs on a bounded prefix of the text). Atomic
    groups and possessive repeats do not backtrack and pass."""
    try:
        parsed = _sre.parse(pattern)
    except Exception:  # noqa: BLE001 - re.compile reports syntax errors itself
        return None
    found = _risky_repeat(parsed)
    if found == "nested":
        return (
            "nested repetition (like (a+)+ or (a*)*) can take exponential time on some inputs; "
            "rewrite it without a repeated group that repeats inside, or make the inner part "
            "atomic ((?>a+)+) or possessive ((a++)+)"
        )
    if found == "branches":
        return (
            "a repeated group whose alternatives can match the same text (like (a|aa)*) can take "
            "exponential time on some inputs; make the alternatives start differently, or the "
            "group atomic ((?>a|aa)*)"
        )
    return None


_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT)


def _risky_repeat(items: Any) -> str | None:
    for op, av in items:
        if op in _REPEATS and (av[1] == _sre.MAXREPEAT or av[1] > 16):
            if _unbounded_inside(av[2]):
                return "nested"
            body_first, _ = _first(av[2])
            if _ambiguous_branches(av[2], body_first):
                return "branches"
        for sub in _children(op, av):
            found = _risky_repeat(sub)
            if found:
                return found
    return None


def _unbounded_inside(items: Any) -> bool:
    for op, av in items:
        if op in _REPEATS and av[1] == _sre.MAXREPEAT:
            return True
        if any(_unbounded_inside(sub) for sub in _children(op, av)):
            return True
    return False


def _first(items: Any) -> tuple[set[int], bool]:
    """The literal characters a sequence can start with, and whether it can match nothing.
    Only literals count: classes (\\w, ., [^x]) are left out, so overlap is never guessed."""
    chars: set[int] = set()
    for op, av in items:
        nullable = False
        if op == _sre.LITERAL:
            chars.add(av)
        elif op == _sre.IN:
            if not any(o == _sre.NEGATE for o, _ in av):
                chars |= {v for o, v in av if o == _sre.LITERAL}
        elif op == _sre.SUBPATTERN:
            sub, nullable = _first(av[3])
            chars |= sub
        elif op == _sre.BRANCH:
            for branch in av[1]:
                sub, empty = _first(branch)
                chars |= sub
                nullable = nullable or empty
        elif op in _REPEATS:
            sub, _ = _first(av[2])
            chars |= sub
            nullable = av[0] == 0
        elif op == _sre.AT:
            nullable = True  # an anchor consumes nothing
        if not nullable:
            return chars, False
    return chars, True


def _ambiguous_branches(items: Any, follow: set[int]) -> bool:
    """Whether an alternation in `items` (a repeated body) has two branches that can start with
    the same character; an empty branch starts with whatever follows it (`follow`: what may come
    after `items`, the body's own start for a repeat)."""
    for i, (op, av) in enumerate(items):
        rest, rest_nullable = _first(items[i + 1 :])
        after = rest | follow if rest_nullable else rest
        if op == _sre.BRANCH:
            starts = []
            for branch in av[1]:
                first, empty = _first(branch)
                starts.append(first | after if empty else first)
            for j, a in enumerate(starts):
                if any(a & b for b in starts[j + 1 :]):
                    return True
        elif op == _sre.SUBPATTERN and _ambiguous_branches(av[3], after):
            return True
    return False


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed regex item (atomic groups and possessive repeats excluded:
    they never backtrack into)."""
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
        return [av[2]]
    if op == _sre.SUBPATTERN:
        return [av[3]]
    if op == _sre.BRANCH:
        return list(av[1])
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [av[1]]
    if op == _sre.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    return []


class RuleMatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    aliases: list[str] = Field(default_factory=list)
    classes: list[str] = Field(default_factory=list)
    tenants: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    regex: str | None = Field(None, max_length=MAX_REGEX_CHARS)

    _sets: tuple[frozenset[str], frozenset[str], frozenset[str]] = PrivateAttr()
    _keywords: tuple[str, ...] = PrivateAttr()
    _regex: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from None
            problem = backtracking_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _compile(self) -> RuleMatch:
        if not (self.aliases or self.classes or self.tenants or self.keywords or self.regex):
            raise ValueError("a rule needs at least one criterion (use `default` for a catch-all)")
        self._sets = (
            frozenset(_casefold_all(self.aliases)),
            frozenset(_casefold_all(self.classes)),
            frozenset(_casefold_all(self.tenants)),
        )
        self._keywords = tuple(_casefold_all(self.keywords))
        self._regex = re.compile(self.regex) if self.regex else None
        return self

    def matches(self, alias: str, cls: str, tenant: str, text: str, text_cf: str) -> bool:
        aliases, classes, tenants = self._sets
        if aliases and alias.casefold() not in aliases:
            return False
        if classes and cls.casefold() not in classes:
            return False
        if tenants and tenant.casefold() not in tenants:
            return False
        if self._keywords and not any(k in text_cf for k in self._keywords):
            return False
        if self._regex is None:
            return True
        return self._regex.search(text[:MAX_REGEX_INPUT]) is not None


class DefaultRule(BaseModel):
    """The answer itself; the catch-all ``default`` has nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(default="default", min_length=1)
    template: str = Field(min_length=1)
    status: int = Field(default=200, ge=200, le=599)
    queue: bool = False
    retry_after_s: float = Field(
        default=30.0,
        ge=0,
        le=MAX_RETRY_AFTER_S,
        description="Used when the gateway knows none.",
    )

    @field_validator("template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(value)]
        except ValueError as exc:
            raise ValueError(
                f"bad placeholder syntax ({exc}); write {{{{ }}}} for braces"
            ) from None
        used = [(f, spec, conv) for f, spec, conv in parsed if f is not None]
        unknown = sorted({f for f, _, _ in used if f not in PLACEHOLDERS})
        if unknown or any(spec or conv for _, spec, conv in used):
            allowed = ", ".join(sorted(PLACEHOLDERS))
            raise ValueError(
                f"unknown placeholder {unknown or '(format spec)'}; allowed: {allowed}"
            )
        return value


class Rule(DefaultRule):
    name: str = Field(min_length=1)
    match: RuleMatch


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rules: list[Rule] = Field(default_factory=list)
    default: DefaultRule | None = None


@dataclass(frozen=True)
class RuleSet:
    """Rules of all files in order, plus the catch-all (if a file defines one)."""

    rules: tuple[Rule, ...] = ()
    default: DefaultRule | None = None
    files: tuple[str, ...] = ()

    def match(self, alias: str, cls: str, tenant: str, last_user_text: str) -> DefaultRule | None:
        """First rule that matches, else the default, else None."""
        text_cf = last_user_text.casefold()
        for rule in self.rules:
            if rule.match.matches(alias, cls, tenant, last_user_text, text_cf):
                return rule
        return self.default


# ---- loading --------------------------------------------------------------------------------


def _field_path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _dotted(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc)


def _bracketed(dotted: str) -> str:
    """A source-map path ("rules.0.name") as rule errors write paths ("rules[0].name")."""
    return _field_path(int(p) if p.isdigit() else p for p in dotted.split("."))


def _read_yaml(path: Path) -> tuple[Any, SourceMap]:
    try:
        # Bounded size, depth and alias expansion, like policy files (a YAML bomb is refused).
        data = read_bounded(path)  # a device or a FIFO is refused, never read without end
        return load_yaml(data.decode("utf-8"))
    except OSError as exc:
        raise RuleFileError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RuleFileError(
            str(path), "", f"not UTF-8 text (byte 0x{data[exc.start]:02x})", line
        ) from None
    except YamlLimitError as exc:
        raise RuleFileError(str(path), "", f"refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise RuleFileError(str(path), where, f"invalid YAML: {exc}") from None


def _load(path: Path) -> tuple[RuleFile, SourceMap]:
    raw, smap = _read_yaml(path)
    if smap.duplicates:
        # PyYAML keeps the last value silently; every duplicate at once: one edit fixes them all.
        first, *later = smap.duplicates
        duplicates = tuple(
            f"{_bracketed(d.path)}: duplicate key (first given on line {d.first_line}) "
            f"(line {d.line})"
            for d in later
        )
        problem = f"duplicate key (first given on line {first.first_line})"
        raise RuleFileError(str(path), _bracketed(first.path), problem, first.line, duplicates)
    if raw is None:
        raw = {}
    try:
        return RuleFile.model_validate(raw), smap
    except ValidationError as exc:
        head, *others = exc.errors()
        more: list[str] = []
        for e in others:  # every problem at once: one edit fixes them all
            line = smap.line_of(_dotted(e["loc"]))
            at = f" (line {line})" if line is not None else ""
            msg = str(e["msg"]).removeprefix("Value error, ")
            more.append(f"{_field_path(e['loc'])}: {msg}{at}")
        problem = str(head["msg"]).removeprefix("Value error, ")
        line = smap.line_of(_dotted(head["loc"])) if head["loc"] else None
        raise RuleFileError(
            str(path), _field_path(head["loc"]), problem, line, tuple(more)
        ) from None


def load_file(path: Path) -> RuleFile:
    """Parse and validate one YAML file; :class:`RuleFileError` names file, field and line."""
    return _load(path)[0]


def rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


def load_rules(path: str | Path) -> RuleSet:
    """Load one rule file or every ``*.yaml``/``*.yml`` of a folder (in name order)."""
    root = Path(path)
    try:
        if not root.exists():
            raise RuleFileError(str(root), "", "no such file or folder")
        files = rule_files(root)
    except OSError as exc:  # a name too long, a folder that cannot be listed
        raise RuleFileError(str(root), "", f"cannot read: {exc.strerror or exc}") from None
    rules: list[Rule] = []
    default: DefaultRule | None = None
    default_file, names = "", dict[str, str]()
    for file in files:
        parsed, smap = _load(file)
        for i, rule in enumerate(parsed.rules):
            if rule.name in names:
                raise RuleFileError(
                    str(file),
                    f"rules[{i}].name",
                    f"{rule.name!r} already used in {names[rule.name]}",
                    smap.line_of(f"rules.{i}.name"),
                )
            names[rule.name] = str(file)
            rules.append(rule)
        if parsed.default is not None:
            if default is not None:
                raise RuleFileError(
                    str(file),
                    "default",
                    f"a default is already in {default_file}",
                    smap.line_of("default"),
                )
            default, default_file = parsed.default, str(file)
    return RuleSet(tuple(rules), default, tuple(str(f) for f in files))


# ---- the policy's rules ---------------------------------------------------------------------


def rules_path(policy: Policy, policy_path: str | Path | None) -> Path | None:
    """The rules file or folder a policy names; a relative one is relative to the policy file."""
    rules = policy.degradation.rules
    if rules is None:
        return None
    p = Path(rules)
    if not p.is_absolute() and policy_path:
        # Not resolve(): a ConfigMap volume's policy.yaml is a symlink into a timestamped folder,
        # and the rules path is relative to where the policy is mounted, not to that folder.
        p = Path(os.path.abspath(policy_path)).parent / p
    return p


def check_rules(policy: Policy, policy_path: str | Path | None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the degradation rules `policy` names: they must load; models and
    classes they match on that the policy does not have are warnings (such a rule never
    matches here)."""
    path = rules_path(policy, policy_path)
    if path is None:
        return [], []
    try:
        rules = load_rules(path)
    except RuleFileError as e:
        return [f"degradation.rules: {e}"], []
    warnings: list[str] = []
    classes = {c.name for c in policy.classes} | {policy.default_class}
    for rule in rules.rules:
        for a in rule.match.aliases:
            if a not in policy.models:
                warnings.append(
                    f"degradation rule '{rule.name}': match.aliases: unknown model '{a}'"
                )
        for c in rule.match.classes:
            if c not in classes:
                warnings.append(
                    f"degradation rule '{rule.name}': match.classes: unknown class '{c}'"
                )
    return [], warnings
