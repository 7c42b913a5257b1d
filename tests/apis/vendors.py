"""A gateway with one alias per vendor, for the inbound API tests: `an` (the Anthropic-shaped
simulator of the module's fleet), `gm` (Gemini-shaped) and `br` (Bedrock-shaped, SigV4 signed),
each alone in its pool. Each simulator validates the translated request against its provider's
published request types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from loadtests.simulator.bedrock import BedrockCredentials, run_bedrock
from loadtests.simulator.gemini import run_gemini
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

VENDORS = ("an", "gm", "br")
AN_KEY, GM_KEY = "ak-vendors", "gm-vendors"
CREDS = BedrockCredentials("AKIDVENDORS", "vendors-secret", "vendors-token", "eu-west-1")
BR_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
#: The fleet member a module's FLEET must hold for `an`.
ANTHROPIC: dict[str, Any] = {
    "name": "an",
    "profile": "fast",
    "wire": "anthropic",
    "api_key": AN_KEY,
}
ENV = {
    "VND_AN_KEY": AN_KEY,
    "VND_GM_KEY": GM_KEY,
    "VND_BR_ID": CREDS.access_key_id,
    "VND_BR_SECRET": CREDS.secret_access_key,
    "VND_BR_TOKEN": CREDS.session_token or "",
}


@contextlib.contextmanager
def vendor_gateway(
    fleet: Fleet, *, head: str = "", providers: str = "", pools: str = "", models: str = ""
) -> Iterator[GatewayServer]:
    """The gateway; `head` is policy text before `providers:`, the others lines added to those
    sections (two-space indented YAML)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        with run_gemini(GM_KEY) as gm, run_bedrock(CREDS, models=(BR_MODEL,)) as br:
            bedrock = (
                "{region: eu-west-1, access_key_id_env: VND_BR_ID, "
                "secret_access_key_env: VND_BR_SECRET, session_token_env: VND_BR_TOKEN}"
            )
            policy = f"""{head}
providers:
  an: {{type: anthropic, base_url: '{fleet.root_url("an")}', api_key_env: VND_AN_KEY, models: {{'*': claude-sim-1}}}}
  gm: {{type: gemini, base_url: '{gm.url}', api_key_env: VND_GM_KEY, models: {{'*': gemini-2.0-flash}}}}
  br: {{type: bedrock, base_url: '{br.url}', models: {{'*': '{BR_MODEL}'}}, bedrock: {bedrock}}}
{providers}
pools:
  pan: {{members: [an]}}
  pgm: {{members: [gm]}}
  pbr: {{members: [br]}}
{pools}
models:
  an: {{pool: pan}}
  gm: {{pool: pgm}}
  br: {{pool: pbr}}
{models}
"""
            with GatewayServer(policy) as server:
                yield server
