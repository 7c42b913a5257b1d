"""The embedded default: a simulated fleet on loopback and a demo policy over it.

Lets a newcomer run `gateway serve` with no configuration, keys or Redis and get answers from the
OpenAI SDK at once. Every model in /v1/models says its providers are simulated.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from importlib import resources
from pathlib import Path

from loadtests.simulator.testing import Fleet, spawn_fleet

DEMO_FLEET = [
    {"name": "sim-fast-1", "profile": "low-latency"},
    {"name": "sim-fast-2", "profile": "low-latency"},
    {"name": "sim-batch-1", "profile": "big-batch"},
    {"name": "sim-batch-2", "profile": "big-batch"},
]


def start_demo() -> tuple[Fleet, Path]:
    """Start the simulated fleet (a child process) and write the demo policy pointing at it."""
    fleet = spawn_fleet(DEMO_FLEET)
    atexit.register(fleet.close)
    env_names = {
        "sim-fast-1": "DEMO_FAST_1",
        "sim-fast-2": "DEMO_FAST_2",
        "sim-batch-1": "DEMO_BATCH_1",
        "sim-batch-2": "DEMO_BATCH_2",
    }
    text = resources.files("gateway.builtin").joinpath("demo.yaml").read_text()
    for name, var in env_names.items():
        text = text.replace("${" + var + "}", fleet.url(name))
    folder = Path(tempfile.mkdtemp(prefix="gateway-demo-"))
    path = folder / "demo-policy.yaml"
    path.write_text(text)
    os.environ.setdefault("GATEWAY_DEMO", "1")
    return fleet, path
