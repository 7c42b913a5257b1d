"""Build the app from environment settings (what `gateway serve` and each worker process read)."""

from __future__ import annotations

import logging
import os

from fastapi import FastAPI

from gateway.app import create_app
from gateway.policy.loader import load_policy

log = logging.getLogger("gateway")


def build_app() -> FastAPI:
    """uvicorn factory: reads GATEWAY_POLICY (a file path), set by the CLI or the environment."""
    path = os.environ.get("GATEWAY_POLICY")
    if not path:
        raise RuntimeError("GATEWAY_POLICY is not set")
    policy = load_policy(path)
    app = create_app(policy, policy_path=path)
    return app
