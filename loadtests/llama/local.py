"""``gateway serve --real-local``: two llama.cpp servers and the policy that routes to them.

Real generated text (SmolLM2-135M on the CPU) with no API key, as the demo mode gives simulated
text. The policy is ``policies/real-local.yaml`` from the source tree; its provider URLs come
from ``LLAMA_URL_A`` / ``LLAMA_URL_B``, which are set here to the servers just started.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from loadtests.llama.launcher import LlamaError, LlamaInstance, start_instances, stop_all

POLICY = Path(__file__).resolve().parents[2] / "policies" / "real-local.yaml"
URL_VARS = ("LLAMA_URL_A", "LLAMA_URL_B")


def start_real_local(
    threads: int = 1, slots: int = 2, ctx_size: int = 2048
) -> tuple[list[LlamaInstance], Path]:
    """Start two servers on free loopback ports; returns them and the policy file to serve.

    Raises ``LlamaError`` when the engine, the weights or the policy file is missing. The servers
    stop with this process (``stop_all`` at exit; they also exit when their stdin closes).
    """
    if not POLICY.is_file():
        raise LlamaError(f"{POLICY} not found: --real-local needs a source checkout")
    instances = start_instances(2, threads=threads, slots=slots, ctx_size=ctx_size)
    atexit.register(stop_all, instances)
    for var, inst in zip(URL_VARS, instances, strict=True):
        os.environ[var] = inst.url
    return instances, POLICY
