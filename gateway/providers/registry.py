"""Every adapter, registered by importing its module (see base.py for how to add one)."""

from __future__ import annotations

from gateway.providers import anthropic, azure, bedrock, gemini, openai  # noqa: F401
from gateway.providers.base import ADAPTERS, Adapter, make_adapter

__all__ = ["ADAPTERS", "Adapter", "make_adapter"]
