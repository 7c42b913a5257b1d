"""Running as several processes: settings for limits shared among them and for draining.

A policy's `max_inflight`, admission queue depth and retry budget floor describe the whole
deployment. With shared state (Redis) every process announces itself and learns how many
processes are alive (`gateway.infra.shares`), and takes its share of each limit; on SIGTERM a process
drains for up to `drain_s` (`gateway.http.drain`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    share_limits: bool = Field(
        True,
        description="Divide each member's max_inflight, each pool's queue depth and the retry "
        "budget floor among the live gateway processes (learned through REDIS_URL), so the "
        "policy's figures hold for the whole deployment.",
    )
    heartbeat_s: float = Field(
        1.0,
        ge=0.05,
        le=30,
        description="How often a process announces itself; a process silent for 3 heartbeats "
        "(at least 2 s) is gone and its share goes to the others.",
    )
    drain_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="On SIGTERM: report not ready, stop accepting, and let requests and streams "
        "in flight finish for up to this long before exiting.",
    )
