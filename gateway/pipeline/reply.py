"""What a stage gets back from `next`: a Starlette response, and a way to act when it has ended.

A stage owns its "after" even for a stream: `on_finish(response, fn)` runs `fn` once the client
has been answered, however that ended: a unary body sent, a stream finished, broken, or dropped by
the client before or during sending (tower's "completion recorded when the handle drops"). Hooks run
innermost first, in the order the stages registered them, each at most once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger("gateway")

Finish = Callable[[], None]


class StreamReply(StreamingResponse):
    """A streamed answer whose end runs the stages' hooks exactly once.

    `abandon()` is the one clean-up: the server calls it once sending has ended (finished,
    client gone before or during the stream, server stopping); it closes the body iterator (so the
    producer's own `finally` runs now, not when collected) and then runs the hooks.
    """

    def __init__(self, body: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._hooks: list[Finish] = []
        self._ended = False

    def on_finish(self, fn: Finish) -> None:
        self._hooks.append(fn)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.abandon()

    async def closed(self) -> None:
        """The producer's clean-up when the stream was never iterated (client gone first)."""

    async def abandon(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            await self.closed()
        finally:
            # Dropped once run: a hook may hold this response (a stage's closure over it), and
            # that cycle would keep the request's objects alive until a garbage collection.
            hooks, self._hooks = self._hooks, []
            run_hooks(hooks)


def run_hooks(hooks: list[Finish]) -> None:
    for fn in hooks:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one hook's bug must not skip the others
            log.exception("a finish hook failed", exc_info=exc)


class _Hooks:
    """The background task of a unary response: its hooks, run after the body was sent."""

    __slots__ = ("first", "hooks")

    def __init__(self, first: BackgroundTask | None) -> None:
        self.first = first  # a background task the response already had
        self.hooks: list[Finish] = []

    async def __call__(self) -> None:
        hooks, self.hooks = self.hooks, []  # once, even if run again
        try:
            if self.first is not None:
                await self.first()
        finally:
            run_hooks(hooks)


def on_finish(response: Response, fn: Finish) -> None:
    """Run `fn` once `response` has been answered (see the module docstring)."""
    if isinstance(response, StreamReply):
        response.on_finish(fn)
        return
    bg = response.background
    current = bg.func if bg is not None else None
    if isinstance(current, _Hooks):
        current.hooks.append(fn)
        return
    hooks = _Hooks(bg)
    response.background = BackgroundTask(hooks)
    hooks.hooks.append(fn)


def finish_now(response: Response) -> None:
    """Run a response's hooks without sending it (a replay's stored answer)."""
    if isinstance(response, StreamReply):
        response._ended = True
        hooks, response._hooks = response._hooks, []
        run_hooks(hooks)
        return
    bg = response.background
    if bg is not None and isinstance(bg.func, _Hooks):
        response.background = None
        hooks, bg.func.hooks = bg.func.hooks, []
        run_hooks(hooks)
