"""`compose`: stages run outermost first; each sees what the inner ones answered."""

from __future__ import annotations

from starlette.responses import Response

from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next, compose
from tests.pipeline.conftest import FakeNext, make_call, snapshot


class Tag:
    """Logs its name before and after `next`, and adds its name to the answer's header."""

    def __init__(self, name: str, log: list[str], answer: bool = False) -> None:
        self.name, self.log, self.answer = name, log, answer

    async def __call__(self, call: Call, next: Next) -> Response:
        self.log.append(f"{self.name}>")
        if self.answer:
            response = Response(b"early", status_code=203)
        else:
            response = await next(call)
        self.log.append(f"<{self.name}")
        response.headers["x-path"] = response.headers.get("x-path", "end") + f",{self.name}"
        return response


async def test_outermost_first_and_each_sees_the_inner_response() -> None:
    log: list[str] = []
    end = FakeNext(Response(b"inner"))
    handler = compose([Tag("a", log), Tag("b", log), Tag("c", log)], end)
    call = make_call(snapshot())
    response = await handler(call)
    assert log == ["a>", "b>", "c>", "<c", "<b", "<a"]
    assert response.headers["x-path"] == "end,c,b,a"
    assert end.calls == [call]
    assert response.body == b"inner"


async def test_a_stage_may_answer_without_calling_next() -> None:
    log: list[str] = []
    end = FakeNext()
    handler = compose([Tag("a", log), Tag("b", log, answer=True), Tag("c", log)], end)
    response = await handler(make_call(snapshot()))
    assert log == ["a>", "b>", "<b", "<a"]
    assert (response.status_code, response.body) == (203, b"early")
    assert response.headers["x-path"] == "end,b,a"
    assert end.calls == []


async def test_no_stages_is_the_end_itself() -> None:
    end = FakeNext(Response(b"only"))
    response = await compose([], end)(make_call(snapshot()))
    assert response.body == b"only" and len(end.calls) == 1
