"""Start a fleet from Python: in a background thread (tests) or a child process (benchmarks, demo).

    with run_fleet([InstanceSpec(name="a", profile="fast")]) as fleet:
        client = openai.OpenAI(base_url=fleet.url("a"), api_key="x")
        fleet.set_faults("a", error_rate=1.0, error_status=[503])

Both return the same ``Fleet`` handle. The thread variant controls instances directly; the
process variant goes through the fleet admin port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .faults import HEALTHY, Faults
from .fleet import READY_PREFIX, FleetServer, new_event_loop
from .profiles import InstanceSpec

SpecLike = InstanceSpec | Mapping[str, Any]


class _Control(Protocol):
    def set_faults(self, name: str, faults: Faults) -> None: ...
    def faults(self, name: str) -> dict[str, Any]: ...
    def stats(self, name: str) -> dict[str, Any]: ...
    def reset(self, name: str) -> None: ...


class Fleet:
    """Handle on a running fleet: URLs and fault/stat control per instance name."""

    def __init__(
        self,
        urls: dict[str, str],
        admin_url: str | None,
        control: _Control,
        closer: Callable[[], None],
        pid: int | None = None,
    ) -> None:
        self._urls = urls
        self.pid = pid  # the child's process id (spawn_fleet), e.g. to measure its CPU time
        self.admin_url = admin_url
        self._control = control
        self._closer: Callable[[], None] | None = closer

    @property
    def names(self) -> list[str]:
        return list(self._urls)

    def url(self, name: str) -> str:
        """Base URL for OpenAI clients, e.g. ``http://127.0.0.1:40123/v1``."""
        return self._urls[name]

    def root_url(self, name: str) -> str:
        """Server root, e.g. ``http://127.0.0.1:40123`` (for /health and /admin)."""
        return self._urls[name].removesuffix("/v1")

    def port(self, name: str) -> int:
        return int(self.root_url(name).rsplit(":", 1)[1])

    def urls(self) -> dict[str, str]:
        return dict(self._urls)

    def set_faults(self, name: str, **faults: Any) -> Faults:
        """Replace the instance's faults (validated); takes effect before this returns."""
        f = Faults(**faults)
        self._control.set_faults(name, f)
        return f

    def clear_faults(self, name: str) -> None:
        self._control.set_faults(name, HEALTHY)

    def faults(self, name: str) -> dict[str, Any]:
        return self._control.faults(name)

    def stats(self, name: str) -> dict[str, Any]:
        return self._control.stats(name)

    def reset(self, name: str) -> None:
        """Clear the instance's counters and prefix cache."""
        self._control.reset(name)

    def close(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            closer()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _specs(instances: Sequence[SpecLike]) -> list[InstanceSpec]:
    return [i if isinstance(i, InstanceSpec) else InstanceSpec.model_validate(i) for i in instances]


# -- in a background thread -----------------------------------------------------------------------
class _ThreadControl:
    def __init__(self, loop: asyncio.AbstractEventLoop, server: FleetServer) -> None:
        self.loop, self.server = loop, server

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def set_faults(self, name: str, faults: Faults) -> None:
        inst = self.server.instances[name]
        self._call(lambda: inst.apply_faults(faults))

    def faults(self, name: str) -> dict[str, Any]:
        return self._call(lambda: self.server.instances[name].faults.faults.model_dump())

    def stats(self, name: str) -> dict[str, Any]:
        return self._call(lambda: self.server.instances[name].stats_dict())

    def reset(self, name: str) -> None:
        self._call(lambda: self.server.instances[name].reset())


async def _shutdown(server: FleetServer) -> None:
    await server.stop()
    await asyncio.sleep(0.01)  # let closed connections cancel their tasks
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def run_fleet(
    instances: Sequence[SpecLike],
    *,
    profiles_file: Path | None = None,
    admin: bool = False,
) -> Fleet:
    """Run the fleet in a daemon thread with its own event loop; ports are ephemeral by default.

    ``admin=True`` also opens the fleet admin port (``fleet.admin_url``).
    """
    loop = new_event_loop()
    server = FleetServer(_specs(instances), profiles_file, admin_port=0 if admin else None)
    thread = threading.Thread(target=loop.run_forever, name="sim-fleet", daemon=True)
    thread.start()

    def close() -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_shutdown(server), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()

    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=30)
    except BaseException:
        close()
        raise
    return Fleet(server.urls(), server.admin_url, _ThreadControl(loop, server), close)


# -- in a child process ----------------------------------------------------------------------------
class _HttpControl:
    def __init__(self, admin_url: str) -> None:
        import httpx  # only the process variant needs an HTTP client

        self.client = httpx.Client(base_url=admin_url, timeout=30)

    def _req(self, method: str, path: str, body: Any = None) -> Any:
        r = self.client.request(method, path, json=body)
        r.raise_for_status()
        return r.json()

    def set_faults(self, name: str, faults: Faults) -> None:
        self._req("POST", f"/instances/{name}/faults", faults.model_dump())

    def faults(self, name: str) -> dict[str, Any]:
        return self._req("GET", f"/instances/{name}/faults")

    def stats(self, name: str) -> dict[str, Any]:
        return self._req("GET", f"/instances/{name}/stats")

    def reset(self, name: str) -> None:
        self._req("POST", f"/instances/{name}/reset")


def spawn_fleet(
    instances: Sequence[SpecLike],
    *,
    profiles_file: Path | None = None,
    timeout_s: float = 15.0,
    python: str = sys.executable,
) -> Fleet:
    """Run the fleet in a child process (``python -m loadtests.simulator fleet``).

    The child exits when the handle is closed or when this process dies (its stdin closes).
    """
    specs = [s.model_dump(mode="json") for s in _specs(instances)]
    cmd = [
        python,
        "-m",
        "loadtests.simulator",
        "fleet",
        "--specs-json",
        json.dumps(specs),
        "--admin-port",
        "0",
        "--ready-line",
        "--exit-on-stdin-eof",
    ]
    if profiles_file is not None:
        cmd += ["--profiles-file", str(profiles_file)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    ready = _wait_ready(proc, timeout_s)

    def close() -> None:
        control.client.close()
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    control = _HttpControl(ready["admin"])
    return Fleet(ready["instances"], ready["admin"], control, close, pid=proc.pid)


def _wait_ready(proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    """Read the child's stdout until its ready line (JSON with the URLs)."""
    found: dict[str, Any] = {}

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(READY_PREFIX):
                found.update(json.loads(line[len(READY_PREFIX) :]))
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout_s)
    if not found:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"simulator fleet did not start within {timeout_s} s")
    return found
