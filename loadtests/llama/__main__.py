"""``python -m loadtests.llama --n 2 --base-port 8201``: run local llama.cpp servers.

They run until Ctrl-C or SIGTERM. An instance that dies (say, killed by hand to simulate a
crash) is reported and the others keep serving.

``--ready-line`` prints ``LLAMA-READY {"instances": {name: url, ...}}`` once all serve, and
``--exit-on-stdin-eof`` stops them when stdin closes: how ``gateway serve --real-local`` runs them
as a child process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from loadtests.llama.launcher import LlamaError, start_instances, stop_all

READY_PREFIX = "LLAMA-READY "  # then JSON with the servers' URLs (--ready-line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.llama", description=__doc__)
    ap.add_argument("--n", type=int, default=2, help="number of instances")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per instance")
    ap.add_argument("--slots", type=int, default=2, help="parallel requests per instance")
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot, in tokens")
    ap.add_argument(
        "--base-port", type=int, default=None, help="ports base..base+n-1 (default: free)"
    )
    ap.add_argument("--alias", default="smollm2", help="model name the servers report")
    ap.add_argument("--no-prompt-cache", action="store_true", help="disable KV prefix reuse")
    ap.add_argument(
        "--ready-line",
        action="store_true",
        help=f"print {READY_PREFIX.strip()} and the URLs as JSON once all serve",
    )
    ap.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (parent gone)"
    )
    args = ap.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if args.exit_on_stdin_eof:

        def watch() -> None:
            while os.read(0, 4096):  # b"" at EOF: the parent closed the pipe or died
                pass  # (os.read, not sys.stdin: no buffer lock left held at exit)
            stop.set()

        threading.Thread(target=watch, daemon=True).start()
    try:
        instances = start_instances(
            args.n,
            base_port=args.base_port,
            threads=args.threads,
            slots=args.slots,
            ctx_size=args.ctx,
            alias=args.alias,
            prompt_cache=not args.no_prompt_cache,
        )
    except LlamaError as exc:
        print(exc, file=sys.stderr)
        return 1
    for inst in instances:
        print(
            f"{inst.name}: {inst.url} (pid {inst.pid}, ready in {inst.startup_s:.2f} s)", flush=True
        )
    print("Ctrl-C or SIGTERM stops them.", flush=True)
    if args.ready_line:
        ready = {"instances": {inst.name: inst.url for inst in instances}}
        print(READY_PREFIX + json.dumps(ready), flush=True)
    try:
        reported: set[str] = set()
        while not stop.wait(1.0):
            for inst in instances:
                if inst.name not in reported and not inst.is_alive():
                    reported.add(inst.name)
                    code = inst.proc.poll() if inst.proc else None
                    print(f"{inst.name} exited (code {code})", flush=True)
    finally:
        stop_all(instances)
    return 0


if __name__ == "__main__":
    sys.exit(main())
