"""A fleet: several instances plus one admin port, all on one asyncio loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from .admin import FleetAdmin
from .http import Connection, listen
from .profiles import InstanceSpec, resolve_profile
from .server import Instance

READY_PREFIX = "SIM-READY "  # the line spawn_fleet and the gateway demo wait for, then JSON


class FleetServer:
    """Starts and stops a set of named instances and their shared admin port."""

    def __init__(
        self,
        specs: Sequence[InstanceSpec],
        profiles_file: Path | None = None,
        admin_host: str = "127.0.0.1",
        admin_port: int | None = 0,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("instance names must be unique")
        self.instances: dict[str, Instance] = {
            s.name: Instance(s, resolve_profile(s, profiles_file)) for s in specs
        }
        self.admin_host, self.admin_port = admin_host, admin_port
        self._admin_server: asyncio.Server | None = None
        self._admin_conns: set[Connection] = set()

    @property
    def admin_url(self) -> str | None:
        if self._admin_server is None:
            return None
        return f"http://{self.admin_host}:{self.admin_port}"

    def urls(self) -> dict[str, str]:
        """Base URL (ending in /v1) of each instance."""
        return {name: inst.root_url + "/v1" for name, inst in self.instances.items()}

    async def start(self) -> None:
        try:
            for inst in self.instances.values():
                await inst.start()
            if self.admin_port is not None:
                admin = FleetAdmin(self.instances)
                self._admin_server = await listen(
                    admin, self.admin_host, self.admin_port, self._admin_conns
                )
                self.admin_port = self._admin_server.sockets[0].getsockname()[1]
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for inst in self.instances.values():
            await inst.stop()
        if self._admin_server is not None:
            self._admin_server.close()
            self._admin_server = None
        for c in list(self._admin_conns):
            c.close()
        await asyncio.sleep(0)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is, with uvicorn[standard]), else the default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
