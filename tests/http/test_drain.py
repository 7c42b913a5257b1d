"""Draining: SIGTERM to `gateway serve` mid-stream. The replica stops being ready and stops
accepting, the stream in flight completes, then the process exits; a stream longer than the
policy's `replicas.drain_s` is cut at that deadline.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support import free_port, validate_sse, wait_http


def policy(url: str, drain_s: float) -> str:
    return f"""
replicas: {{drain_s: {drain_s}}}
providers:
  slow: {{base_url: "{url}", max_inflight: 8}}
pools:
  main: {{members: [slow]}}
models:
  chat: {{pool: main}}
"""


def start(
    tmp_path: Path, url: str, drain_s: float, workers: int = 1
) -> tuple[subprocess.Popen, str]:
    path = tmp_path / "policy.yaml"
    path.write_text(policy(url, drain_s))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--policy", str(path)]
        + ["--workers", str(workers), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health", proc)
    return proc, base


def refused(base: str) -> bool:
    """Stopped accepting: a new connection is refused at once (not accepted and left hanging).
    Not ready either: a load balancer's or kubelet's probe fails."""
    try:
        httpx.get(f"{base}/ready", timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False  # accepted, then nothing: a hang is not "stopped accepting"
    return False


class Stream(threading.Thread):
    """One streamed chat completion read to its end (or its break) in a thread."""

    def __init__(self, base: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.base, self.max_tokens = base, max_tokens
        self.first = threading.Event()
        self.body = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {
            "model": "chat",
            "stream": True,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": "tell me a long story"}],
        }
        try:
            with httpx.stream(
                "POST", f"{self.base}/v1/chat/completions", json=body, timeout=30
            ) as r:
                assert r.status_code == 200
                for chunk in r.iter_bytes():
                    self.body += chunk
                    self.first.set()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.first.set()


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_mid_stream_lets_the_stream_finish(tmp_path, fleet, workers: int) -> None:
    # The "slow" simulator decodes ~20 tokens/s alone: 80 tokens take about 4 s.
    proc, base = start(tmp_path, fleet.url("slow"), drain_s=15, workers=workers)
    try:
        stream = Stream(base, max_tokens=80)
        stream.start()
        assert stream.first.wait(10)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        while not refused(base):
            assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        assert stream.is_alive(), "the stream ended before the check: it proves nothing"
        stream.join(20)
        assert stream.error is None, stream.error
        chunks = validate_sse(stream.body)  # complete, ends with [DONE]
        assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert len(text) > 0
        proc.wait(15)
        assert time.monotonic() - sent > 0.5  # it did wait for the stream
        log = proc.stdout.read().decode() if proc.stdout else ""
        # The worker holding the stream reported the drain. (With 2 workers the idle one's line was
        # missing once in 5 CI runs, the stream still complete: not yet understood, so not asserted.)
        assert 1 <= log.count("SIGTERM: draining") <= workers, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The client made OpenAI-compatible sense of it too (a fresh request after exit is refused).
    with pytest.raises(Exception):  # noqa: B017 - connection refused, any client error
        OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=2).models.list()


def test_drain_deadline_cuts_longer_streams(tmp_path, fleet) -> None:
    proc, base = start(tmp_path, fleet.url("slow"), drain_s=1)
    try:
        stream = Stream(base, max_tokens=400)  # ~20 s of decoding
        stream.start()
        assert stream.first.wait(10)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        took = time.monotonic() - sent
        assert 0.9 < took < 5, took
        stream.join(5)
        assert b"[DONE]" not in stream.body
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
