"""The gateway's own serving stack with no gateway in it: a floor for what Python can add.

    UPSTREAM=http://127.0.0.1:8000 python -m loadtests.stack_floor --port 9001

uvicorn (httptools, uvloop) receives each POST, aiohttp forwards its body to the same path on
UPSTREAM over pooled connections and the answer goes back as it arrives (streams chunk by chunk).
No parsing, classification, routing, caching, metrics or logs. Measured beside the gateway by
``python -m loadtests.overhead --floor``, it splits the gateway's added latency into what the
libraries and the extra process cost and what the gateway's own work costs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]


class Forward:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.session is not None:
                await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=0)
            self.session = aiohttp.ClientSession(connector=connector)
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {"content-type": "application/json"}
        url = self.upstream + scope["path"]
        async with self.session.request(scope["method"], url, data=body, headers=headers) as r:
            kind = r.headers.get("content-type", "")
            out = [(b"content-type", kind.encode())]
            if not kind.startswith("text/event-stream"):
                data = await r.read()
                out.append((b"content-length", str(len(data)).encode()))
                await send({"type": "http.response.start", "status": r.status, "headers": out})
                await send({"type": "http.response.body", "body": data})
                return
            await send({"type": "http.response.start", "status": r.status, "headers": out})
            async for chunk in r.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", default=os.environ.get("UPSTREAM", ""), help="upstream root URL")
    a = p.parse_args()
    if not a.upstream:
        raise SystemExit("give --upstream or UPSTREAM")
    uvicorn.run(
        Forward(a.upstream),
        host="127.0.0.1",
        port=a.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
