"""The embedded default: a simulated fleet on loopback and a demo policy over it.

Lets a newcomer run `gateway serve` with no configuration, keys or Redis and get answers from the
OpenAI SDK at once. Every model in /v1/models says its providers are simulated. The fleet is the
load-test simulator run as a child process (`python -m loadtests.simulator fleet ...`), stopped
with the gateway.

`gateway serve --real-local` likewise starts two local llama.cpp servers
(`python -m loadtests.llama --n 2 ...`) and serves `policies/real-local.yaml` over them.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path

from gateway.children import Child, ChildError, start_child

DEMO_FLEET = [
    {"name": "sim-fast-1", "profile": "low-latency"},
    {"name": "sim-fast-2", "profile": "low-latency"},
    {"name": "sim-batch-1", "profile": "big-batch"},
    {"name": "sim-batch-2", "profile": "big-batch"},
]
ENV_NAMES = {
    "sim-fast-1": "DEMO_FAST_1",
    "sim-fast-2": "DEMO_FAST_2",
    "sim-batch-1": "DEMO_BATCH_1",
    "sim-batch-2": "DEMO_BATCH_2",
}
#: The simulator's ready line: this prefix, then JSON with the instances' URLs.
READY_PREFIX = "SIM-READY "


def fleet_command() -> list[str]:
    """Arguments of `python -m loadtests.simulator` for the demo fleet."""
    return [
        "fleet",
        "--specs-json",
        json.dumps(DEMO_FLEET),
        "--admin-port",
        "0",
        "--ready-line",
        "--exit-on-stdin-eof",
    ]


def start_demo() -> tuple[Child, Path]:
    """Start the simulated fleet (a child process) and write the demo policy pointing at it.

    Raises ``ChildError`` when the simulator is not installed or does not start.
    """
    fleet = start_child("the simulated fleet", "loadtests.simulator", fleet_command(), READY_PREFIX)
    text = resources.files("gateway.builtin").joinpath("demo.yaml").read_text()
    for name, var in ENV_NAMES.items():
        text = text.replace("${" + var + "}", fleet.url(name))
    folder = Path(tempfile.mkdtemp(prefix="gateway-demo-"))
    fleet.leftovers.append(folder)
    path = folder / "demo-policy.yaml"
    path.write_text(text)
    os.environ.setdefault("GATEWAY_DEMO", "1")
    return fleet, path


REAL_LOCAL_POLICY = Path(__file__).resolve().parents[1] / "policies" / "real-local.yaml"
REAL_LOCAL_VARS = ("LLAMA_URL_A", "LLAMA_URL_B")
LLAMA_READY_PREFIX = "LLAMA-READY "


def start_real_local() -> tuple[Child, Path]:
    """Two llama.cpp servers (SmolLM2-135M, 1 thread, 2 slots of 2048 tokens) on free loopback
    ports, and the policy file to serve over them (its URLs come from LLAMA_URL_A / LLAMA_URL_B,
    set here). Raises ``ChildError`` when the policy, the engine or the weights are missing."""
    if not REAL_LOCAL_POLICY.is_file():
        raise ChildError(f"{REAL_LOCAL_POLICY} not found: --real-local needs a source checkout")
    args = ["--n", "2", "--threads", "1", "--slots", "2", "--ctx", "2048"]
    args += ["--ready-line", "--exit-on-stdin-eof"]
    servers = start_child(
        "the local llama.cpp servers", "loadtests.llama", args, LLAMA_READY_PREFIX, timeout_s=120
    )
    for var, url in zip(REAL_LOCAL_VARS, servers.urls(), strict=True):
        os.environ[var] = url
    return servers, REAL_LOCAL_POLICY
