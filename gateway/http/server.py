"""Build the app from environment settings (what `gateway serve` and each worker process read)."""

from __future__ import annotations

import asyncio
import logging
import os

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from gateway import errors
from gateway.apis.exchange import InboundAPI
from gateway.http.app import create_app
from gateway.http.protocol import GONE_KEY
from gateway.pipeline.reply import finish_now
from gateway.pipeline.stack import Pipeline
from gateway.policy.loader import load_policy
from gateway.wire.request import Endpoint

log = logging.getLogger("gateway")

# The inference routes, answered by the pipeline without FastAPI's routing and middleware layers.
FAST_ROUTES: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


class FastRoutes:
    """ASGI entry point: POSTs to the inference routes go straight to the pipeline.

    FastAPI's stack (exception, body-limit and exit-stack middleware, routing, endpoint wrapper)
    cost about as much CPU per request as the whole pipeline on a zero-latency upstream. The
    pipeline answers every outcome itself (OpenAI-shaped errors included); an unexpected exception
    gets the same 500 body the app's handler gives. Everything else, and every request once
    middleware has been added to the app, goes through FastAPI unchanged.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.pipeline: Pipeline = app.state.pipeline
        self.inbound: dict[str, InboundAPI] = getattr(app.state, "inbound", {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not self.app.user_middleware:
            path: str = scope["path"]
            root = scope.get("root_path")
            if root and path.startswith(root):
                path = path[len(root) :]
            endpoint = FAST_ROUTES.get(path)
            api = self.inbound.get(path) if endpoint is None else None
            if endpoint is not None or api is not None:
                scope["app"] = self.app
                watch = _GoneWatch(scope, receive)
                try:
                    response = await self.pipeline.handle(
                        Request(scope, watch.receive), endpoint or "chat", api
                    )
                except asyncio.CancelledError:
                    if not watch.stop():
                        raise
                    return  # the client left before its answer: recorded as 499, nothing sent
                except Exception as exc:
                    log.exception("unexpected error", exc_info=exc)
                    response = errors.internal_error().to_response()
                if watch.stop():
                    return  # gone just as the answer came: nobody to send it to
                if isinstance(response, StreamingResponse) and response.background is None:
                    await send_stream(response, receive, send)
                else:
                    try:
                        await response(scope, receive, send)
                    except Exception as exc:  # the connection went as the answer was sent
                        log.info("answer not sent: %s", type(exc).__name__)
                        finish_now(response)  # its stages' hooks still run: recorded once
                return
        await self.app(scope, receive, send)


async def send_stream(response: StreamingResponse, receive: Receive, send: Send) -> None:
    """Send a streaming response from this task; stop it when the client goes away.

    What Starlette does with an anyio task group (two tasks and cancel scopes per stream), done
    with one listener task: when the client disconnects mid-stream, this task is cancelled at its
    current await (closing the upstream stream), and the cancellation ends here.
    """
    task = asyncio.current_task()
    assert task is not None
    state = {"running": True, "gone": False}

    def on_message(listener: asyncio.Task[bool]) -> None:
        if state["running"] and not listener.cancelled() and listener.exception() is None:
            state["gone"] = True
            task.cancel()

    listener = asyncio.ensure_future(_disconnected(receive))
    listener.add_done_callback(on_message)
    try:
        await response.stream_response(send)
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        task.uncancel()
    finally:
        state["running"] = False
        listener.remove_done_callback(on_message)
        listener.cancel()
        abandon = getattr(response, "abandon", None)
        if abandon is not None:
            await abandon()  # the attempt settled and the request recorded, however it ended


class _GoneWatch:
    """Notices a client that leaves while its request waits (in an admission queue, for a
    non-streamed answer or a stream's first byte) and cancels the request's task: its upstream
    call stops, its slot frees, and it is recorded as the 499 it is (it was recorded 200 and
    kept its slot). Armed once the body has been read (a disconnect before is the pipeline's:
    a 408 after the body timeout, a 499); the HTTP protocol calls it when the connection is
    lost (`GONE_KEY`), so nothing listens per request."""

    __slots__ = ("_receive", "_scope", "_task", "gone")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._receive = receive
        self._scope = scope
        self._task = asyncio.current_task()
        self.gone = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self._scope[GONE_KEY] = self._lost
        return message

    def _lost(self) -> None:
        if self._scope.pop(GONE_KEY, None) is not None and self._task is not None:
            self.gone = True
            self._task.cancel()

    def stop(self) -> bool:
        """Disarm; True when the client was found gone (the cancellation is spent)."""
        self._scope.pop(GONE_KEY, None)
        if self.gone and self._task is not None:
            self._task.uncancel()
        return self.gone


async def _disconnected(receive: Receive) -> bool:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True


def build_app() -> FastRoutes:
    """uvicorn factory: reads GATEWAY_POLICY (a file path), set by the CLI or the environment."""
    path = os.environ.get("GATEWAY_POLICY")
    if not path:
        raise RuntimeError("GATEWAY_POLICY is not set")
    policy = load_policy(path)
    return FastRoutes(create_app(policy, policy_path=path))
