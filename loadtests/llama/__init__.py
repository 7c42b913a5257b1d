"""llama.cpp's OpenAI-compatible server (PyPI ``xllamacpp``) as a real local upstream."""

from loadtests.llama.launcher import (
    LlamaConfig,
    LlamaError,
    LlamaInstance,
    engine_available,
    find_model,
    llama_instances,
    start_instances,
    stop_all,
    unavailable_reason,
)

__all__ = [
    "LlamaConfig",
    "LlamaError",
    "LlamaInstance",
    "engine_available",
    "unavailable_reason",
    "find_model",
    "llama_instances",
    "start_instances",
    "stop_all",
]
