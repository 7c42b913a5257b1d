"""Admin endpoints: per instance (``/admin/...`` on its own port) and per fleet (one admin port).

Instance port:  GET|POST|DELETE /admin/faults, GET /admin/stats, POST /admin/reset.
Fleet admin port (reachable while an instance refuses connections):
    GET /instances, GET /health, and GET|POST|DELETE /instances/{name}/faults,
    GET /instances/{name}/stats, POST /instances/{name}/reset.
POST .../faults replaces the instance's whole fault set with the validated body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from .faults import HEALTHY, Faults
from .http import App, Connection, Request
from .responses import error_body

if TYPE_CHECKING:
    from .server import Instance


async def control(
    inst: Instance, method: bytes, action: str, raw: bytes, conn: Connection
) -> tuple[int, bytes]:
    """Run one admin action; returns (status, body), or (0, b"") when already answered."""
    if action == "faults":
        if method == b"GET":
            return 200, orjson.dumps(inst.faults.faults.model_dump())
        if method == b"DELETE":
            await inst.apply_faults(HEALTHY)
            return 200, orjson.dumps(HEALTHY.model_dump())
        if method == b"POST":
            try:
                faults = Faults.model_validate_json(raw or b"{}")
            except ValidationError as e:
                msg = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
                return 400, error_body(msg or "invalid faults", "invalid_request_error", "faults")
            body = orjson.dumps(faults.model_dump())
            if faults.refuse_connections:
                # Answer before the listening socket and this connection go away.
                conn.send(200, body)
                await inst.apply_faults(faults)
                return 0, b""
            await inst.apply_faults(faults)
            return 200, body
    elif action == "stats" and method == b"GET":
        return 200, orjson.dumps(inst.stats_dict())
    elif action == "reset" and method == b"POST":
        inst.reset()
        return 200, b'{"reset":true}'
    return 404, error_body(
        f"unknown admin action {method.decode()} {action}", "invalid_request_error"
    )


class FleetAdmin(App):
    """The fleet's admin port: controls every instance by name."""

    def __init__(self, instances: dict[str, Instance]) -> None:
        self.instances = instances

    def listing(self) -> dict[str, Any]:
        return {
            name: {"url": inst.root_url + "/v1", "profile": inst.spec.profile, "port": inst.port}
            for name, inst in self.instances.items()
        }

    async def handle(self, req: Request, conn: Connection) -> None:
        parts = req.path.decode().strip("/").split("/")
        if parts == ["health"]:
            conn.send(200, b'{"status":"ok"}')
            return
        if parts == ["instances"] and req.method == b"GET":
            conn.send(200, orjson.dumps(self.listing()))
            return
        if len(parts) == 3 and parts[0] == "instances":
            inst = self.instances.get(parts[1])
            if inst is None:
                conn.send(404, error_body(f"no instance {parts[1]!r}", "invalid_request_error"))
                return
            status, body = await control(inst, req.method, parts[2], req.body, conn)
            if status:
                conn.send(status, body)
            return
        conn.send(404, error_body("unknown admin path", "invalid_request_error"))
