"""Build the app from environment settings (what `gateway serve` and each worker process read)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from gateway import errors
from gateway.apis.exchange import InboundAPI
from gateway.context import Context
from gateway.errors import GatewayError
from gateway.http.app import create_app, endpoint_of, shaped
from gateway.http.hosts import ALLOWED_HOSTS_ENV, AllowedHosts, host_name, loopback_name
from gateway.http.protocol import GONE_KEY
from gateway.pipeline.reply import finish_now
from gateway.pipeline.stack import Pipeline, client_request_id
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

    def __init__(self, app: FastAPI, allowed_hosts: AllowedHosts | None = None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts or AllowedHosts([])
        self.pipeline: Pipeline = app.state.pipeline
        self.inbound: dict[str, InboundAPI] = getattr(app.state, "inbound", {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await self._refuse(refusal, scope, receive, send)
                return
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

    def _refusal(self, scope: Scope) -> GatewayError | None:
        """Why the gateway refuses a request before reading it, if it does: a name not in
        GATEWAY_ALLOWED_HOSTS, a cross-site form POST, or a re-pointed name (DNS rebinding)
        reaching what loopback callers may use without a key."""
        path: str = scope["path"]
        host: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
                break
        name = host_name(host) if host is not None else None  # one bounded parse
        listed = bool(self.allowed_hosts) and self.allowed_hosts.allows(name)
        if self.allowed_hosts and path not in HEALTH_PATHS and not listed:
            return GatewayError(
                403,
                f"This gateway serves only the host names in {ALLOWED_HOSTS_ENV} (and "
                "loopback names); add this request's host name there to serve it.",
                type="permission_error",
                code="host_not_allowed",
            )
        if cross_origin(scope):
            return GatewayError(
                403,
                "Cross-origin requests from web pages are refused: the gateway serves no CORS.",
                type="permission_error",
                code="cross_origin_refused",
            )
        if host is None or (name is not None and loopback_name(name)):
            return None  # (HTTP/1.0 without Host: no browser sends that)
        if self._rebound_admin(path):
            return GatewayError(
                403,
                "Without GATEWAY_ADMIN_KEY the admin API answers only requests addressed to a "
                "loopback name (localhost, 127.0.0.1, [::1]); set GATEWAY_ADMIN_KEY to reach it "
                "by another name.",
                code="admin_forbidden",
            )
        if not listed and self._rebound_open_api(scope):
            return GatewayError(
                403,
                "This gateway has no API keys, and a web page sent this request to a host name "
                "that is not a loopback one: refused as a possible DNS-rebinding attack on the "
                f"open API. To serve browsers under this name, add it to {ALLOWED_HOSTS_ENV} "
                "or set GATEWAY_API_KEYS.",
                type="permission_error",
                code="rebinding_refused",
            )
        return None

    def _rebound_admin(self, path: str) -> bool:
        """Whether a request under a non-loopback name is to what loopback callers may use
        without a key (the admin API and dashboard, `/metrics`).

        A web page whose host name an attacker re-points to 127.0.0.1 (DNS rebinding) is, to the
        browser, the same origin as the gateway: it may send any request and read the answer
        (list members, create a managed key and read its secret), and it arrives from loopback.
        Its `Host` still names the attacker's domain: that is what tells it apart.
        """
        if not (path.startswith("/admin") or path == "/metrics"):
            return False
        if os.environ.get("GATEWAY_ADMIN_KEY", "").strip():
            return False  # the key decides, whatever the name
        return not (path == "/metrics" and self.app.state.runtime.snapshot.policy.metrics.public)

    def _rebound_open_api(self, scope: Scope) -> bool:
        """Whether a browser's request under a non-loopback name, over loopback, is to an API
        without client keys (a re-pointed web page would spend the operator's provider credit).

        Only browsers are refused (they send `Origin` or `Sec-Fetch-*`): SDKs, curl and a reverse
        proxy on this machine forwarding its public `Host` send none of them. A name the
        operator listed in GATEWAY_ALLOWED_HOSTS is theirs, not an attacker's.
        """
        path: str = scope["path"]
        if not (path == "/v1" or path.startswith("/v1/")):
            return False
        snap = self.app.state.runtime.snapshot
        if not snap.keys.open or snap.policy.governance.require_key:
            return False
        if not _over_loopback(scope):
            return False
        return any(name in _BROWSER_HEADERS for name, _ in scope["headers"])

    async def _refuse(self, err: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
        """`err` in the path's API shape, recorded like any request (one access-log line, one
        metrics observation)."""
        request = Request(scope, receive)
        ctx = Context(client_request_id(request.headers.get("x-request-id")), time.perf_counter())
        path: str = scope["path"]
        ctx.endpoint, ctx.status = endpoint_of(path), err.status
        try:
            await shaped(err, path, {"x-request-id": ctx.request_id})(scope, receive, send)
        finally:
            self.pipeline.record(ctx)


# Liveness and readiness probes: a load balancer or kubelet names the gateway by its address.
HEALTH_PATHS = frozenset({"/health", "/ready"})
# Headers only browsers send (fetch metadata, the page's origin).
_BROWSER_HEADERS = frozenset({b"origin", b"sec-fetch-site", b"sec-fetch-mode"})


def _over_loopback(scope: Scope) -> bool:
    """Whether the connection is over loopback. The local address first: uvicorn rewrites the
    client address from X-Forwarded-For sent from 127.0.0.1, which a same-origin page can set."""
    for key in ("server", "client"):
        addr = scope.get(key)
        if addr and loopback_name(str(addr[0]).lower()):
            return True
    return False


# Body types a browser sends cross-origin without asking first (a "simple" request, no preflight;
# anything else is preceded by an OPTIONS that the gateway never grants).
_SIMPLE_TYPES = frozenset(
    {b"", b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"}
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def cross_origin(scope: Scope) -> bool:
    """Whether a request is a simple POST from a web page of another origin (CSRF).

    The gateway sends no CORS headers, so no page of another origin can read its answers or pass
    a preflight; but a browser sends a simple POST (a text/plain or form body, no custom header)
    without asking, and the server acts on it: any web site a user visits could spend an open
    gateway's provider credit, or drive a loopback admin API that has no key (drain members,
    open breakers, reload, create keys). Browsers mark such requests with `Sec-Fetch-Site`
    (anything but `same-origin` or `none`, a user's own navigation), and older ones with an
    `Origin` naming another host than the `Host` they address. Clients that are not browsers
    send neither, and a JSON request with a key is never a simple one: neither is affected.
    """
    if scope["method"] != "POST":
        return False
    origin = host = site = None
    ctype = b""
    for name, value in scope["headers"]:
        if name == b"sec-fetch-site":
            site = value
        elif name == b"origin":
            origin = value
        elif name == b"host":
            host = value
        elif name == b"content-type":
            ctype = value.split(b";", 1)[0].strip().lower()
    if ctype not in _SIMPLE_TYPES:
        return False
    if site is not None:
        return site.strip().lower() not in (b"same-origin", b"none")
    if origin is None:
        return False
    return not _same_origin(origin, host)


def loopback_host(host: bytes) -> bool:
    """Whether a `Host` value names this machine's loopback: `localhost` (or a name under it),
    127.0.0.0/8 or ::1, with any port."""
    name = host_name(host)
    return name is not None and loopback_name(name)


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether `Origin` names the host and port that `Host` addresses (a `null` origin, from a
    sandboxed or local page, never does). A `Host` without a port matches its scheme's default
    (the scheme is the origin's: a proxy may end TLS before the gateway)."""
    try:
        o = urlsplit(origin.decode("latin-1").strip())
        h = urlsplit("//" + (host or b"").decode("latin-1").strip())
        o_port = o.port or _DEFAULT_PORTS.get(o.scheme.lower())
        h_port = h.port
    except ValueError:
        return False
    if not o.hostname or not h.hostname or o.hostname.lower() != h.hostname.lower():
        return False
    if h_port is None:
        return o.port is None or o.port == _DEFAULT_PORTS.get(o.scheme.lower())
    return o_port == h_port


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
    allowed = AllowedHosts.from_env()  # before anything starts: a bad entry stops here
    policy = load_policy(path)
    return FastRoutes(create_app(policy, policy_path=path), allowed)
