"""A streamed answer cached and replayed keeps its choices, tool calls and logprobs."""

from __future__ import annotations

import orjson

from gateway.wire.chunks import StreamAssembler, completion_to_events
from loadtests.simulator.behaviour import Choice, Plan, logprobs_for
from loadtests.simulator.responses import ChatFormat, usage
from tests.support import validate, validate_sse


def test_round_trip_of_n_choices_with_logprobs_and_a_tool_call() -> None:
    text = Choice(0, ["Hello", " there"], "stop")
    text.logprobs = logprobs_for(text.pieces, 1, 2)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    other = {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}
    tool = Choice(1, ['{"', "a", '":', "1}", "{}"], "tool_calls", [call, other], [0, 0, 0, 0, 1])
    plan = Plan([text, tool], 2, True)
    fmt = ChatFormat("chatcmpl-1", 1, "demo", "fp_x", include_usage=True)
    stream = (
        fmt.plan_start(plan)
        + fmt.plan_pieces(plan, 0, 5)
        + fmt.usage_chunk(usage(3, plan.tokens, 0))
        + b"data: [DONE]\n\n"
    )
    validate_sse(stream)
    asm = StreamAssembler()
    for ev in stream.split(b"\n\n"):
        if ev:
            asm.feed_event(ev + b"\n\n")
    assert asm.complete()
    done = asm.to_completion()
    validate("CreateChatCompletionResponse", done)
    assert done == orjson.loads(fmt.plan_body(plan, usage(3, plan.tokens, 0)))
    replay = completion_to_events(done, include_usage=True)
    again = StreamAssembler()
    for ev in replay:
        again.feed_event(ev)
    validate_sse(b"".join(replay))
    assert again.to_completion() == done
