"""The request path as a stack of stages, in the spirit of tower layers and Starlette middleware.

A stage is `async (call, next) -> Response`: it does its part before calling `next` (or answers
itself: a cache hit, a refusal) and its part after, on the response `next` returned; for a stream
it registers what must happen at the stream's end with `on_finish` (gateway.pipeline.reply).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol

from starlette.responses import Response

from gateway.pipeline.call import Call

Next = Callable[[Call], Awaitable[Response]]


class Stage(Protocol):
    name: str

    async def __call__(self, call: Call, next: Next) -> Response: ...


def compose(stages: Sequence[Stage], end: Next) -> Next:
    """One handler: `stages[0]` outermost, `end` innermost."""
    handler = end
    for stage in reversed(stages):
        # partial, not a closure: calling it makes the stage's own coroutine, no extra frame.
        handler = partial(stage, next=handler)
    return handler
