"""Command line: ``python -m loadtests.simulator serve|fleet|profiles``.

    python -m loadtests.simulator serve --profile fast --port 9001 --name a
    python -m loadtests.simulator fleet --file loadtests/fleet.yaml
    python -m loadtests.simulator profiles

Ctrl-C or SIGTERM stops cleanly. As a child process (spawn_fleet, the gateway's built-in demo):
``fleet --specs-json JSON --admin-port 0 --ready-line --exit-on-stdin-eof`` prints
``SIM-READY {"admin": URL, "instances": {name: URL}}`` once serving and stops when stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from .fleet import READY_PREFIX, FleetServer, new_event_loop
from .profiles import DEFAULT_PROFILES_FILE, InstanceSpec, load_fleet_file, load_profiles


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run one instance")
    s.add_argument("--name", default="sim")
    s.add_argument("--profile", default="fast")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=9001)
    s.add_argument("--speed", type=float, default=1.0, help="0.5 = twice as slow")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    s.add_argument(
        "--wire",
        choices=["openai", "azure", "anthropic"],
        default="openai",
        help="the API spoken: OpenAI, Azure OpenAI URLs and api-key, or Anthropic Messages "
        "(requests checked against the provider's published shapes)",
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a profile field (YAML value), repeatable",
    )
    s.add_argument("--admin-port", type=int, default=None, help="also open the fleet admin port")
    f = sub.add_parser("fleet", help="run several instances from a fleet file")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", type=Path)
    src.add_argument("--specs-json", help="instances as a JSON list (used by spawn_fleet)")
    f.add_argument("--admin-port", type=int, default=None, help="overrides the file's admin_port")
    f.add_argument(
        "--ready-line",
        action="store_true",
        help=f"print {READY_PREFIX.strip()} and the admin and instance URLs as JSON once serving",
    )
    f.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (parent gone)"
    )
    for q in (s, f):
        q.add_argument("--profiles-file", type=Path, default=None)
    sub.add_parser("profiles", help="list the profiles")
    return p


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects FIELD=VALUE, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _fleet_from_args(args: argparse.Namespace) -> FleetServer:
    if args.cmd == "serve":
        spec = InstanceSpec(
            name=args.name,
            profile=args.profile,
            host=args.host,
            port=args.port,
            speed=args.speed,
            api_key=args.api_key,
            wire=args.wire,
            overrides=_overrides(args.set),
        )
        return FleetServer([spec], args.profiles_file, admin_port=args.admin_port)
    if args.specs_json:
        specs = [InstanceSpec.model_validate(x) for x in json.loads(args.specs_json)]
        return FleetServer(specs, args.profiles_file, admin_port=args.admin_port)
    ff = load_fleet_file(args.file)
    profiles = args.profiles_file or (
        (args.file.parent / ff.profiles_file) if ff.profiles_file else None
    )
    admin_port = args.admin_port if args.admin_port is not None else ff.admin_port
    return FleetServer(ff.instances, profiles, ff.admin_host, admin_port)


async def _run(server: FleetServer, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if getattr(args, "exit_on_stdin_eof", False):

        def watch() -> None:
            while os.read(0, 4096):  # b"" at EOF: the parent closed the pipe or died
                pass  # (os.read, not sys.stdin: no buffer lock left held at exit)
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch, daemon=True).start()
    await server.start()
    for name, inst in server.instances.items():
        print(f"sim {name:<16} profile={inst.spec.profile:<13} {inst.root_url}/v1", flush=True)
    if server.admin_url:
        print(f"admin {server.admin_url}  (POST /instances/{{name}}/faults ...)", flush=True)
    if getattr(args, "ready_line", False):
        ready = {"admin": server.admin_url, "instances": server.urls()}
        print(READY_PREFIX + json.dumps(ready), flush=True)
    await stop.wait()
    await server.stop()
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "profiles":
        for name, prof in load_profiles(DEFAULT_PROFILES_FILE).items():
            print(f"{name:<14} {prof.description}")
        return 0
    server = _fleet_from_args(args)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_run(server, args))
    finally:
        with contextlib.suppress(Exception):
            loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
