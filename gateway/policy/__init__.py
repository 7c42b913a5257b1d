"""Policy files: schema, loading and hot reload."""

from gateway.policy.loader import PolicyError, load_policy, parse_policy
from gateway.policy.schema import Policy

__all__ = ["Policy", "PolicyError", "load_policy", "parse_policy"]
