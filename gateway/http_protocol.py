"""uvicorn's httptools protocol, with one fix for clients that reset their connections.

uvicorn (0.54) cancels a connection's keep-alive timer only when the connection closed cleanly;
after a reset (ConnectionResetError) the timer keeps the protocol object, its parser and the last
request's state alive until the keep-alive timeout fires. Under a load of clients that drop their
connections (e.g. streaming clients that stop reading at ``[DONE]``) that pinned tens of KB per
connection and nearly doubled the worker's RSS. Cancelling the timer on every loss frees it at once.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GatewayHttpProtocol(HttpToolsProtocol):
    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        unset = getattr(self, "_unset_keepalive_if_required", None)  # absent in other versions
        if unset is not None:
            unset()
