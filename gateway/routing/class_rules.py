"""Request classes as policy data: ordered rules, first match wins.

A rule names a class and lists optional conditions; a condition left unset
matches everything, and all set conditions must hold. Token bounds are
inclusive (`min_prompt_tokens: 8000` matches 8000). Rules are checked in
order, so put the narrow ones first; a request no rule matches gets the
default class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What classification looks at, extracted once per request."""

    prompt_tokens: int
    expected_output_tokens: int
    alias: str | None = None
    priority: str | None = None
    tenant: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.expected_output_tokens


class ClassRule(BaseModel):
    """One request class and the conditions a request must meet to be in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    min_prompt_tokens: int | None = Field(default=None, ge=0)
    max_prompt_tokens: int | None = Field(default=None, ge=0)
    min_output_tokens: int | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, ge=0)
    min_total_tokens: int | None = Field(default=None, ge=0)
    max_total_tokens: int | None = Field(default=None, ge=0)
    aliases: list[str] = Field(default_factory=list)
    priority: list[str] = Field(default_factory=list)
    tenants: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> ClassRule:
        for what in ("prompt", "output", "total"):
            lo = getattr(self, f"min_{what}_tokens")
            hi = getattr(self, f"max_{what}_tokens")
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"min_{what}_tokens ({lo}) > max_{what}_tokens ({hi})")
        return self

    def matches(self, f: RequestFeatures) -> bool:
        """True when every condition set on this rule holds for `f`."""
        return (
            _within(f.prompt_tokens, self.min_prompt_tokens, self.max_prompt_tokens)
            and _within(f.expected_output_tokens, self.min_output_tokens, self.max_output_tokens)
            and _within(f.total_tokens, self.min_total_tokens, self.max_total_tokens)
            and _member(f.alias, self.aliases)
            and _member(f.priority, self.priority)
            and _member(f.tenant, self.tenants)
        )


def _within(value: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _member(value: str | None, allowed: list[str]) -> bool:
    # An empty list is an unset condition: it matches everything.
    return not allowed or value in allowed


def classify(features: RequestFeatures, rules: Sequence[ClassRule], default: str) -> str:
    """Name of the first rule `features` match, else `default`."""
    for rule in rules:
        if rule.matches(features):
            return rule.name
    return default
