"""A finished request leaves no reference cycle behind.

Its objects (context, parsed request, attempt, relay, upstream response...) are freed by
reference counting the moment it ends, not by a later garbage collection. A cycle through the
response (a stage's finish hook holding it) once kept a stream's whole request graph alive until
the collector ran, a large share of a streamed request's CPU.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import httpx
import pytest

from tests.support import policy

MSG = [{"role": "user", "content": "Name three rivers."}]


def _cyclic_gateway_objects(run: Callable[[], None]) -> list[str]:
    """The gateway types found in reference cycles left by `run` (the test's own are ignored)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        time.sleep(0.3)  # hooks and records run just after the last byte
        gc.collect()
        found = {
            f"{type(o).__module__}.{type(o).__qualname__}"
            for o in gc.garbage
            if type(o).__module__.startswith("gateway")
        }
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return sorted(found)


@pytest.fixture
def gw(fleet, gateway):
    for name in ("a", "b", "slow"):
        fleet.clear_faults(name)
    return gateway(
        policy(
            fleet,
            "a",
            "b",
            "slow",
            alias={"resume": True},
            pools={
                "main": {"members": ["a", "b"], "max_attempts": 2},
                "slow": {"members": ["slow"]},
            },
            models={"slow": {"pool": "slow"}},
        )
    )


def _post(gw, **body) -> httpx.Response:
    payload = {"model": "chat", "messages": MSG, "max_tokens": 8, "temperature": 0, **body}
    return httpx.post(gw.base_url + "/chat/completions", json=payload, timeout=30)


def test_requests_of_every_kind_leave_no_cycle(gw, fleet) -> None:
    def run() -> None:
        for stream in (True, False):
            extra = {"stream_options": {"include_usage": True}} if stream else {}
            for _ in range(2):  # a miss, then the cache's hit
                r = _post(gw, stream=stream, **extra)
                assert r.status_code == 200
        assert _post(gw, messages=[], stream=True).status_code == 400
        fleet.set_faults("a", error_rate=1.0, error_status=[503])
        try:
            for stream in (True, False):  # one member fails, the other answers
                for i in range(3):
                    r = _post(gw, stream=stream, max_tokens=9 + i)
                    assert r.status_code == 200
        finally:
            fleet.clear_faults("a")
        # Streams cut mid-way: resumed on the other member, or ended with an error event.
        fleet.set_faults("a", cut_stream_after_chunks=2)
        fleet.set_faults("b", cut_stream_after_chunks=2)
        try:
            for i in range(3):
                r = _post(gw, stream=True, max_tokens=20 + i)
                assert r.status_code == 200
        finally:
            fleet.clear_faults("a")
            fleet.clear_faults("b")
        # Broken answers (HTML, cut JSON) that the checks refuse.
        fleet.set_faults("a", broken_body="html", broken_rate=1.0)
        try:
            for stream in (True, False):
                assert _post(gw, stream=stream, max_tokens=30).status_code == 200
        finally:
            fleet.clear_faults("a")
        # The other inbound APIs, translated to chat and back.
        for stream in (False, True):
            messages = {"model": "chat", "max_tokens": 8, "stream": stream, "messages": MSG}
            r = httpx.post(gw.base_url + "/messages", json=messages, timeout=30)
            assert r.status_code == 200
            response = {"model": "chat", "max_output_tokens": 16, "stream": stream, "input": "Hi"}
            r = httpx.post(gw.base_url + "/responses", json=response, timeout=30)
            assert r.status_code == 200
        # A client that leaves mid-stream.
        payload = {"model": "slow", "messages": MSG, "max_tokens": 64, "stream": True}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=payload, timeout=30) as r:
            next(r.iter_raw())

    assert _cyclic_gateway_objects(run) == []
