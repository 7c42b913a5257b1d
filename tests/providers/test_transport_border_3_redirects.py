"""A provider answering with a redirect: never followed, so its key never reaches another origin.

Every provider type's key travels in its own header (`authorization`, `api-key`, `x-api-key`,
`x-goog-api-key`). A provider (or a hijacked DNS name, a proxy) answering 301/302/303/307/308
with a `location` on another host and port would receive that header there if the client
followed. The redirect is an attempt failure (`bad_response`); a second loopback server records
any request that arrives. Gateway on loopback, the official `openai` client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer

KEY = "sk-redirect-test-0123456789abcdef"
CODES = [301, 302, 303, 307, 308]
TYPES = ["openai", "azure", "anthropic", "gemini"]


class Recorder(ThreadedRawServer):
    """Another origin: records the head of every request it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.heads: list[str] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.heads.append((await reader.readuntil(b"\r\n\r\n")).decode("latin-1"))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


class Redirector(ThreadedRawServer):
    """Answers with the redirect its `x-redirect` header names (the provider's configured
    headers), to the recorder, keeping the path and query (plus a `key` parameter, as a
    provider taking keys in the query would expect)."""

    def __init__(self, target_port: int) -> None:
        super().__init__()
        self.target = target_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(": ", 1) for line in head[1:] if line)
            await reader.readexactly(int(fields.get("content-length", "0")))
            target = head[0].split(" ")[1]
            code = int(fields["x-redirect"])
            sep = "&" if "?" in target else "?"
            location = f"http://127.0.0.1:{self.target}{target}{sep}key={KEY}"
            writer.write(
                b"HTTP/1.1 %d Moved\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n"
                % (code, location.encode())
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


@pytest.fixture(scope="module")
def gw(recorder: Recorder) -> Iterator[GatewayServer]:
    lines = ["retry: {max_attempts: 1}", "providers:"]
    pools, models = ["pools:"], ["models:"]
    with Redirector(recorder.port) as red, pytest.MonkeyPatch.context() as mp:
        mp.setenv("REDIRECT_KEY", KEY)
        for kind in TYPES:
            for code in CODES:
                name = f"{kind}_{code}"
                lines.append(
                    f"  {name}: {{type: {kind}, base_url: '{red.url}', api_key_env: REDIRECT_KEY, "
                    f"headers: {{x-redirect: '{code}'}}, models: {{'*': m1}}}}"
                )
                pools.append(f"  p_{name}: {{members: [{name}], max_attempts: 1}}")
                models.append(f"  {name}: {{pool: p_{name}}}")
        with GatewayServer("\n".join(lines + pools + models) + "\n") as g:
            yield g


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("kind", TYPES)
def test_a_redirect_is_a_failed_attempt_and_never_followed(
    gw: GatewayServer, recorder: Recorder, kind: str, code: int, stream: bool
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.APIStatusError) as caught:
        answer = client.chat.completions.create(
            model=f"{kind}_{code}", messages=msgs, max_tokens=8, stream=stream
        )
        if stream:
            list(answer)
    r = caught.value.response
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_bad_response"
    told = r.text + "".join(f"{k}: {v}" for k, v in r.headers.items())
    assert KEY not in told and str(recorder.port) not in told
    assert recorder.heads == []
