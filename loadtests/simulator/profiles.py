"""Engine profiles (how fast a simulated backend is) and instance specs (which profile, where).

Profiles live in ``loadtests/profiles.yaml``. An instance picks one by name and may override any
field, or scale the whole profile with ``speed`` (0.5 = twice as slow, 2 = twice as fast).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .faults import Faults

DEFAULT_PROFILES_FILE = Path(__file__).resolve().parent.parent / "profiles.yaml"


class Profile(BaseModel):
    """Timing and capacity of one simulated inference engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    models: list[str] = Field(default_factory=lambda: ["sim-model"], min_length=1)
    # Capacity: sequences decoded together; FIFO queue behind them (None = unbounded).
    max_batch: int = Field(default=8, ge=1)
    max_queue: int | None = Field(default=None, ge=0)
    overload_status: int = Field(
        default=503, description="status when the queue is full (503 or 429)"
    )
    context_window: int = Field(default=32768, ge=1)
    # Time to first token = queue wait + ttft_base_ms + prefill_ms_per_token * uncached tokens.
    ttft_base_ms: float = Field(default=20.0, ge=0)
    prefill_ms_per_token: float = Field(default=0.2, ge=0)
    # Per-sequence decode rate: decode_tps_alone with one sequence, linearly down to
    # decode_tps_full when max_batch sequences are active.
    decode_tps_alone: float = Field(default=80.0, gt=0)
    decode_tps_full: float = Field(default=40.0, gt=0)
    tick_ms: float = Field(default=5.0, gt=0, description="shortest sleep between decode steps")
    early_headers: bool = Field(
        default=False, description="stream headers at once, not with token 1"
    )
    # Output length when the request gives no max_tokens: lognormal around output_mean.
    output_mean: int = Field(default=200, ge=1)
    output_sigma: float = Field(default=0.5, ge=0)
    max_output: int = Field(default=4096, ge=1)
    # Prefix cache: LRU of chained block hashes, block_tokens tokens per block.
    prefix_cache_blocks: int = Field(default=8192, ge=0)
    block_tokens: int = Field(default=16, ge=1)
    embedding_dim: int = Field(default=384, ge=1)
    # zero_latency: no sleeps, no batching, a fixed answer of static_output_tokens words.
    zero_latency: bool = False
    static_output_tokens: int = Field(default=16, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.decode_tps_full > self.decode_tps_alone:
            raise ValueError("decode_tps_full must not exceed decode_tps_alone")
        if self.overload_status not in (429, 503):
            raise ValueError("overload_status must be 429 or 503")
        return self

    def scaled(self, speed: float) -> Profile:
        """The same engine ``speed`` times faster (rates up, delays down)."""
        if speed == 1.0:
            return self
        return self.model_copy(
            update={
                "ttft_base_ms": self.ttft_base_ms / speed,
                "prefill_ms_per_token": self.prefill_ms_per_token / speed,
                "decode_tps_alone": self.decode_tps_alone * speed,
                "decode_tps_full": self.decode_tps_full * speed,
            }
        )


class ProfilesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profiles: dict[str, Profile]


class InstanceSpec(BaseModel):
    """One simulated backend: a name, a profile and a port (0 = ephemeral)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    profile: str = "fast"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    speed: float = Field(default=1.0, gt=0)
    overrides: dict[str, Any] = Field(default_factory=dict)
    api_key: str | None = None
    wire: Literal["openai", "azure", "anthropic"] = Field(
        "openai", description="The API the instance speaks (azure_wire.py, anthropic_wire.py)."
    )
    faults: Faults | None = None
    seed: int = 0


class FleetFile(BaseModel):
    """A fleet file: instances plus the admin port that controls them all by name."""

    model_config = ConfigDict(extra="forbid")

    admin_host: str = "127.0.0.1"
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    profiles_file: str | None = None
    instances: list[InstanceSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> FleetFile:
        names = [i.name for i in self.instances]
        if len(set(names)) != len(names):
            raise ValueError("instance names must be unique")
        return self


@lru_cache(maxsize=8)
def load_profiles(path: Path = DEFAULT_PROFILES_FILE) -> dict[str, Profile]:
    """Parse and validate a profiles file."""
    data = yaml.safe_load(Path(path).read_text())
    return ProfilesFile.model_validate(data).profiles


def resolve_profile(spec: InstanceSpec, path: Path | None = None) -> Profile:
    """The profile an instance runs with: named profile + overrides, scaled by speed."""
    profiles = load_profiles(Path(path) if path else DEFAULT_PROFILES_FILE)
    if spec.profile not in profiles:
        raise ValueError(f"unknown profile {spec.profile!r}; known: {sorted(profiles)}")
    base = profiles[spec.profile]
    merged = Profile.model_validate({**base.model_dump(), **spec.overrides})
    return merged.scaled(spec.speed)


def load_fleet_file(path: Path) -> FleetFile:
    """Parse and validate a fleet file."""
    return FleetFile.model_validate(yaml.safe_load(Path(path).read_text()))
