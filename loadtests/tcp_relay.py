"""A byte relay: the cheapest possible proxy, as a floor for what one extra hop costs.

    python -m loadtests.tcp_relay --listen 127.0.0.1:9000 --to 127.0.0.1:8000

Each accepted connection gets its own upstream connection and bytes are copied both ways as
they arrive: no HTTP parsing, no routing, nothing else. Whatever latency it adds over a direct
connection is the price of the extra process and loopback hop on this machine (scheduling and
wake-ups included); a gateway cannot add less than that. Runs on uvloop when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


class _Pipe(asyncio.Protocol):
    """One direction's receiver: whatever it reads goes to ``peer``'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.pending: list[bytes] = []  # bytes read before the other side connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        transport.get_extra_info("socket").setsockopt(6, 1, 1)  # TCP_NODELAY

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve(listen: tuple[str, int], to: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()

    def accept() -> _Pipe:
        client = _Pipe()

        async def connect() -> None:
            try:
                transport, upstream = await loop.create_connection(_Pipe, *to)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            if client.transport is None or client.transport.is_closing():
                transport.close()  # the client left while we were connecting
                return
            upstream.peer, client.peer = client, upstream
            for chunk in client.pending:
                transport.write(chunk)
            client.pending.clear()

        loop.create_task(connect())
        return client

    server = await loop.create_server(accept, *listen, backlog=4096)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--listen", type=_addr, required=True, help="host:port to accept on")
    p.add_argument("--to", type=_addr, required=True, help="host:port to relay to")
    a = p.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        try:
            import uvloop
        except ImportError:
            asyncio.run(serve(a.listen, a.to))
        else:
            uvloop.run(serve(a.listen, a.to))


if __name__ == "__main__":
    main()
