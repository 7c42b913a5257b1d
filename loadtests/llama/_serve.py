"""Child-process entry point: one llama.cpp OpenAI-compatible server.

Run as a plain script (``python _serve.py --model ... --port ...``) so it needs nothing but
``xllamacpp``. It prints ``LISTENING <base url>`` on stdout once the HTTP server accepts
connections, then stays up until its stdin closes (the launcher went away) or it gets a signal.
Keeping each server in its own process lets a test SIGKILL it to simulate a crash.
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="path to the .gguf weights")
    ap.add_argument("--alias", default="smollm2")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot, in tokens")
    ap.add_argument("--http-threads", type=int, default=16)
    ap.add_argument("--cache-ram-mib", type=int, default=256)
    ap.add_argument("--no-prompt-cache", action="store_true")
    ap.add_argument("--verbosity", type=int, default=3)
    return ap.parse_args(argv)


def build_params(args: argparse.Namespace):  # -> xllamacpp.CommonParams
    """Fill ``xllamacpp.CommonParams`` from the command line."""
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.model_alias = {args.alias}
    p.hostnames = [args.host]
    p.port = args.port
    p.cpuparams.n_threads = args.threads  # token generation
    p.cpuparams_batch.n_threads = args.threads  # prompt processing
    p.n_parallel = args.slots
    # n_ctx is the KV cache for all slots together; each slot gets n_ctx / n_parallel.
    p.n_ctx = args.ctx * args.slots
    p.n_threads_http = (
        args.http_threads
    )  # default would be ~slots+2: extra clients would queue in accept
    p.cache_prompt = not args.no_prompt_cache  # reuse the KV of a slot's common prefix
    # Host-RAM copies of idle slots' KV (default 8 GiB would be far too much on a small machine).
    p.cache_ram_mib = 0 if args.no_prompt_cache else args.cache_ram_mib
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.verbosity = args.verbosity
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import xllamacpp

    try:
        server = xllamacpp.Server(build_params(args))  # loads the model, starts the HTTP thread
    except RuntimeError as exc:
        print(f"llama server failed to start: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"LISTENING {server.listening_address}", flush=True)
    # Block until the launcher closes our stdin (or dies): no orphaned servers.
    for _ in sys.stdin:
        pass
    sys.stderr.flush()
    os._exit(0)  # skip slow native teardown; the OS frees the model and the socket


if __name__ == "__main__":
    sys.exit(main())
