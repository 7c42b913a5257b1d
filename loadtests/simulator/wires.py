"""The provider wire formats an instance can speak besides OpenAI's (InstanceSpec.wire)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import Instance


def make_wire(kind: str, inst: Instance) -> Any:
    """The handler of `kind`'s requests, or None for plain OpenAI."""
    if kind == "anthropic":
        from .anthropic_wire import AnthropicWire

        return AnthropicWire(inst)
    if kind == "azure":
        from .azure_wire import AzureWire

        return AzureWire(inst)
    return None
