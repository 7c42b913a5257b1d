"""`type: openai`: providers that speak the OpenAI wire format as it is (OpenAI, vLLM, SGLang,
TGI, llama.cpp, Together, Groq, ...). Nothing is mapped: the dispatcher's pass-through path."""

from __future__ import annotations

from typing import ClassVar

from gateway.providers.base import Adapter, register


@register
class OpenAIAdapter(Adapter):
    type: ClassVar[str] = "openai"
    passthrough: ClassVar[bool] = True
    endpoints: ClassVar[frozenset[str]] = frozenset({"chat", "completions", "embeddings"})
