"""The 504 of a request whose deadline (gateway.pipeline.deadline) ran out before any answer."""

from __future__ import annotations

from gateway.pipeline.client_errors import Exhausted
from gateway.pipeline.deadline import Deadline


class DeadlineExceeded(Exhausted):
    """The deadline ran out before any answer started: 504. An `Exhausted`, so a degradation
    rule may answer instead, as when every attempt failed."""

    def __init__(self, deadline: Deadline, attempts: int) -> None:
        tried = f" after {attempts} attempt{'s' * (attempts != 1)}" if attempts else ""
        super().__init__(
            504,
            f"The request's deadline of {deadline.limit_s:g} s ({deadline.source}) ran out "
            f"before any provider answered{tried}.",
            type="timeout_error",
            code="deadline_exceeded",
        )
