"""Loopback throughput of a simulator instance, measured with a minimal raw-socket client.

    python -m loadtests.simulator.bench --profile zero-latency --concurrency 32 --duration 5

The instance runs in a child process (``spawn_fleet``); the client is a bare asyncio HTTP/1.1
client with pre-built request bytes so that it costs far less than the server it measures.
Bounded in time; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import orjson

from .fleet import new_event_loop
from .testing import spawn_fleet


def _request(port: int, stream: bool, prompt_chars: int) -> bytes:
    body = orjson.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "x" * prompt_chars}],
            "stream": stream,
        }
    )
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (port, len(body), body)
    )


async def _worker(port: int, req: bytes, stream: bool, deadline: float, lat: list[float]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    clock = time.perf_counter
    while clock() < deadline:
        t0 = clock()
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head[:40].decode())
        if stream:
            await reader.readuntil(b"\r\n0\r\n\r\n")
        else:
            i = head.index(b"content-length: ") + 16
            await reader.readexactly(int(head[i : head.index(b"\r\n", i)]))
        lat.append(clock() - t0)
        done += 1
    writer.close()
    return done


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` so far (Linux), 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(
    port: int, pid: int | None, concurrency: int, duration: float, stream: bool, chars: int
) -> None:
    req = _request(port, stream, chars)
    lat: list[float] = []
    # Warm-up, then the measured window.
    await asyncio.gather(
        *(_worker(port, req, stream, time.perf_counter() + 0.3, []) for _ in range(concurrency))
    )
    t0, cpu0 = time.perf_counter(), _cpu_s(pid)
    counts = await asyncio.gather(
        *(_worker(port, req, stream, t0 + duration, lat) for _ in range(concurrency))
    )
    elapsed = time.perf_counter() - t0
    cpu = _cpu_s(pid) - cpu0
    lat.sort()
    total = sum(counts)
    p99 = lat[int(len(lat) * 0.99)]
    print(
        f"{'stream' if stream else 'plain'}: {total} requests in {elapsed:.2f} s = "
        f"{total / elapsed:,.0f} req/s, concurrency {concurrency}; latency median "
        f"{statistics.median(lat) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms; "
        f"server CPU {cpu / total * 1e6:.1f} µs/request ({cpu / elapsed * 100:.0f}% of a core)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="zero-latency")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--prompt-chars", type=int, default=200)
    p.add_argument("--stream", action="store_true")
    args = p.parse_args()
    if not 0 < args.duration <= 60:
        raise SystemExit("--duration must be in (0, 60] seconds")
    with spawn_fleet([{"name": "bench", "profile": args.profile}]) as fleet:
        loop = new_event_loop()
        try:
            loop.run_until_complete(
                _run(
                    fleet.port("bench"),
                    fleet.pid,
                    args.concurrency,
                    args.duration,
                    args.stream,
                    args.prompt_chars,
                )
            )
        finally:
            loop.close()


if __name__ == "__main__":
    main()
