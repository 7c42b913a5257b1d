"""Provider simulator: OpenAI-compatible servers that behave like LLM inference backends.

Each instance runs a timing model of an inference engine (continuous batching with a FIFO queue,
prefix cache, prefill and decode rates from a profile) and can inject faults at run time.
Start one from the command line (``python -m loadtests.simulator serve``), a fleet from a file
(``python -m loadtests.simulator fleet --file loadtests/fleet.yaml``), or from Python with
``loadtests.simulator.testing.run_fleet`` / ``spawn_fleet``.
"""

from .faults import Faults
from .profiles import InstanceSpec, Profile, load_profiles
from .testing import Fleet, run_fleet, spawn_fleet

__all__ = [
    "Faults",
    "Fleet",
    "InstanceSpec",
    "Profile",
    "load_profiles",
    "run_fleet",
    "spawn_fleet",
]
