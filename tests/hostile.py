"""A deliberately hostile or broken OpenAI-compatible upstream, on loopback, for security tests.

Raw asyncio (no HTTP framework) so that it can send exactly the bytes a broken provider or proxy
sends: HTML, truncated JSON, compression bombs, streams without `[DONE]`, giant events, error
bodies quoting the key it was given, headers nobody should forward. The behaviour is chosen by the
first path segment: a provider configured with base_url `http://127.0.0.1:PORT/<mode>/v1` gets
mode `<mode>`. Each connection serves one request and is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

from tests.support import free_port

MIB = 1024 * 1024
BOMB_INFLATED = 100 * MIB  # what the gzip bomb inflates to
HUGE_BODY = 60 * MIB
BIG_EVENT = 10 * MIB

# Headers a provider or its proxy adds that must never reach a client.
LEAKY_HEADERS = [
    ("openai-organization", "org-hostile-internal"),
    ("location", "http://gpu-node-3.internal:8000/v1/private"),
    ("access-control-allow-origin", "*"),
    ("set-cookie", "session=abcdef0123456789; HttpOnly"),
    ("x-internal-host", "gpu-node-3.internal"),
    ("x-ratelimit-remaining-requests", "99"),
    ("x-ratelimit-limit-tokens", "100000"),
]


def _completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


def _answer_for(endpoint: str, model: str, content: str) -> dict[str, Any]:
    if endpoint == "embeddings":
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "model": model,
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
    if endpoint == "completions":
        return {
            "id": "cmpl-hostile",
            "object": "text_completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "text": content, "finish_reason": "stop", "logprobs": None}],
        }
    return _completion(model, content)


class HostileUpstream:
    """Serves the modes below on a loopback port, in a thread with its own event loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: dict[str, int] = {}
        self._bomb: bytes | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    # -- lifecycle --------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def __enter__(self) -> HostileUpstream:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", self.port), self._loop
        )
        self._server = fut.result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # -- HTTP -------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            req = json.loads(body or b"{}")
            parts = path.strip("/").split("/")
            mode = parts[0]
            endpoint = {"chat": "chat", "completions": "completions", "embeddings": "embeddings"}[
                parts[2] if len(parts) > 2 else "chat"
            ]
            self.requests[mode] = self.requests.get(mode, 0) + 1
            key = headers.get("authorization", "").removeprefix("Bearer ")
            await getattr(self, "mode_" + mode)(writer, req, endpoint, key)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        head = [f"HTTP/1.1 {status} X", f"content-type: {content_type}"]
        head += [f"{k}: {v}" for k, v in extra or []]
        head += [f"content-length: {len(body)}", "connection: close", "", ""]
        writer.write("\r\n".join(head).encode() + body)
        await writer.drain()

    @classmethod
    async def _invalid(
        cls,
        writer: asyncio.StreamWriter,
        status: int,
        message: str,
        param: str | None,
        code: str,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        """An OpenAI-shaped `invalid_request_error` answer."""
        err = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        }
        await cls._respond(writer, status, json.dumps(err).encode(), extra=extra)

    @staticmethod
    async def _start_chunked(
        writer: asyncio.StreamWriter, content_type: str, extra: list[tuple[str, str]] | None = None
    ) -> None:
        head = ["HTTP/1.1 200 OK", f"content-type: {content_type}", "transfer-encoding: chunked"]
        head += [f"{k}: {v}" for k, v in extra or []]
        head += ["connection: close", "", ""]
        writer.write("\r\n".join(head).encode())
        await writer.drain()

    @staticmethod
    async def _chunk_out(writer: asyncio.StreamWriter, data: bytes, pause: float = 0.0) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)

    @staticmethod
    async def _end_chunked(writer: asyncio.StreamWriter) -> None:
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _sse(
        self,
        writer: asyncio.StreamWriter,
        events: list[bytes],
        pause: float = 0.0,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        await self._start_chunked(writer, "text/event-stream", extra)
        for ev in events:
            await self._chunk_out(writer, ev, pause)
        await self._end_chunked(writer)

    # -- well-behaved ------------------------------------------------------------------------

    async def mode_ok(self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str) -> None:
        await self._ok(w, req, endpoint, "hello from the good member")

    async def _ok(
        self,
        w: asyncio.StreamWriter,
        req: dict,
        endpoint: str,
        content: str,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        model = req.get("model", "m")
        if req.get("stream"):
            events = [
                _chunk(model, {"role": "assistant", "content": ""}),
                _chunk(model, {"content": content}),
                _chunk(model, {}, "stop"),
                b"data: [DONE]\n\n",
            ]
            await self._sse(w, events, extra=extra)
            return
        body = json.dumps(_answer_for(endpoint, model, content)).encode()
        await self._respond(w, 200, body, extra=extra)

    async def mode_headers(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._ok(w, req, endpoint, "with many headers", extra=LEAKY_HEADERS)

    async def mode_echokey(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A 200 whose text quotes the provider key it was sent (a proxy debugging aid gone bad)."""
        await self._ok(w, req, endpoint, f"debug: you authenticated as {key}; all good")

    # -- auth / model refusals ---------------------------------------------------------------

    async def mode_auth401(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        message = (
            f"Incorrect API key provided: {key}. You can find your API key at "
            "https://platform.example.com/account/api-keys."
        )
        extra = [("www-authenticate", f'Bearer realm="gpu-node-3.internal", key="{key}"')]
        await self._invalid(w, 401, message, None, "invalid_api_key", extra + LEAKY_HEADERS)

    async def mode_auth403(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        err = {"error": {"message": "Project does not have access", "type": "permission_error"}}
        await self._respond(w, 403, json.dumps(err).encode())

    async def mode_model404(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        message = f"The model `{req.get('model')}` does not exist or you do not have access to it."
        await self._invalid(w, 404, message, None, "model_not_found")

    async def mode_leaky400(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        message = (
            f"Invalid 'temperature' from proxy http://10.0.3.7:8080/v1/chat (upstream "
            f"gpu-node-3.internal:8000) with key {key}, header Authorization: Bearer {key}, "
            "fallback key sk-proj-abc123DEF456ghi789 and token "
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl; keep this text"
        )
        await self._invalid(w, 400, message, "temperature", "invalid_value", LEAKY_HEADERS)

    # -- broken unary answers ----------------------------------------------------------------

    async def mode_html(self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str) -> None:
        page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
        await self._respond(w, 200, page, content_type="text/html")

    async def mode_truncated(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        body = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"mess'
        await self._respond(w, 200, body)

    async def mode_wrongshape(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._respond(w, 200, b'{"id": "x", "object": "chat.completion", "result": "hi"}')

    async def mode_error200(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._respond(w, 200, b'{"error": {"message": "overloaded", "type": "server_error"}}')

    async def mode_redirect(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        extra = [("location", "http://169.254.169.254/latest/meta-data/")]
        await self._respond(w, 307, b"", extra=extra)

    def _gzip_bomb(self) -> bytes:
        if self._bomb is None:
            comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
            head = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":'
            parts = [comp.compress(head + b'{"role":"assistant","content":"')]
            block = b"a" * MIB
            parts += [comp.compress(block) for _ in range(BOMB_INFLATED // MIB)]
            parts.append(comp.compress(b'"},"finish_reason":"stop"}]}') + comp.flush())
            self._bomb = b"".join(parts)
        return self._bomb

    async def mode_gzipbomb(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        bomb = await asyncio.get_running_loop().run_in_executor(None, self._gzip_bomb)
        await self._respond(w, 200, bomb, extra=[("content-encoding", "gzip")])

    async def mode_huge(self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str) -> None:
        """60 MB of valid-looking JSON, chunked (no length announced up front)."""
        await self._start_chunked(w, "application/json")
        await self._chunk_out(w, b'{"id":"x","choices":[{"index":0,"message":{"content":"')
        block = b"a" * MIB
        for _ in range(HUGE_BODY // MIB):
            await self._chunk_out(w, block)
        await self._chunk_out(w, b'"},"finish_reason":"stop"}]}')
        await self._end_chunked(w)

    # -- broken streams ----------------------------------------------------------------------

    async def mode_jsonstream(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A JSON body (not SSE) as the answer to a streamed request."""
        body = json.dumps(_completion(req.get("model", "m"), "not a stream")).encode()
        await self._respond(w, 200, body)

    async def mode_ssehtml(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """Claims text/event-stream, sends an HTML page."""
        await self._sse(w, [b"<html><body>maintenance</body></html>\n"])

    async def mode_nodone(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """Two chunks, then a clean end of body: no finish_reason, no [DONE]."""
        model = req.get("model", "m")
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "par"}),
        ]
        await self._sse(w, events)

    async def mode_finishnodone(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A complete answer whose server does not send [DONE] (its final chunk ends it)."""
        model = req.get("model", "m")
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "complete"}),
            _chunk(model, {}, "stop"),
        ]
        await self._sse(w, events)

    async def mode_bigevent(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A first chunk with text, then a 10 MB event that never ends."""
        model = req.get("model", "m")
        await self._start_chunked(w, "text/event-stream")
        await self._chunk_out(w, _chunk(model, {"role": "assistant", "content": "par"}))
        await self._chunk_out(w, b'data: {"choices":[{"delta":{"content":"')
        block = b"a" * MIB
        for _ in range(BIG_EVENT // MIB):
            await self._chunk_out(w, block)
        await self._end_chunked(w)

    async def mode_bigfirst(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A 10 MB first event with no terminator: nothing was sent yet, so it can be retried."""
        await self._start_chunked(w, "text/event-stream")
        await self._chunk_out(w, b'data: {"choices":[{"delta":{"content":"')
        block = b"a" * MIB
        for _ in range(BIG_EVENT // MIB):
            await self._chunk_out(w, block)
        await self._end_chunked(w)

    async def mode_errorevent(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A stream that turns into an error event quoting the key, then ends normally."""
        model = req.get("model", "m")
        err = {"error": {"message": f"backend exploded (key {key})", "type": "server_error"}}
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "partial"}),
            b"data: " + json.dumps(err).encode() + b"\n\n",
            b"data: [DONE]\n\n",
        ]
        await self._sse(w, events)

    async def mode_errorfirst(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        err = {"error": {"message": f"overloaded (key {key})", "type": "server_error"}}
        await self._sse(w, [b"data: " + json.dumps(err).encode() + b"\n\n", b"data: [DONE]\n\n"])

    async def mode_echokeystream(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._ok(w, {**req, "stream": True}, endpoint, f"token {key} in a stream")

    async def mode_utf8split(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """Multi-byte characters cut between TCP writes (never between events)."""
        model = req.get("model", "m")
        body = b"".join(
            [
                _chunk(model, {"role": "assistant", "content": ""}),
                _chunk(model, {"content": "héllo 世界 🎉"}),
                _chunk(model, {}, "stop"),
                b"data: [DONE]\n\n",
            ]
        )
        cut = [
            body.index("世".encode()) + 1,
            body.index("🎉".encode()) + 2,
            body.index(b"\xc3") + 1,
        ]
        await self._start_chunked(w, "text/event-stream")
        prev = 0
        for at in sorted(cut):
            await self._chunk_out(w, body[prev:at], pause=0.02)
            prev = at
        await self._chunk_out(w, body[prev:])
        await self._end_chunked(w)

    async def mode_utf8events(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A provider that splits one character's bytes between two events (byte-level tokens)."""
        model = req.get("model", "m")
        euro = "€".encode()  # 3 bytes
        template = _chunk(model, {"content": "X"})
        first = template.replace(b'"X"', b'"ok ' + euro[:2] + b'"')
        second = template.replace(b'"X"', b'"' + euro[2:] + b' end"')
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            first,
            second,
            _chunk(model, {}, "stop"),
            b"data: [DONE]\n\n",
        ]
        await self._sse(w, events)

    # -- right outer shape, wrong inner types (unary) ------------------------------------------

    async def _bent(self, w: asyncio.StreamWriter, req: dict, bend: Any) -> None:
        doc = _completion(req.get("model", "m"), "bent")
        bend(doc)
        await self._respond(w, 200, json.dumps(doc).encode())

    async def mode_badcontent(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._bent(w, req, lambda d: d["choices"][0]["message"].update(content=12345))

    async def mode_emptymessage(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._bent(w, req, lambda d: d["choices"][0].update(message={}))

    async def mode_badtoolcalls(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        calls = [{"id": 1, "type": "function", "function": "x"}]
        await self._bent(w, req, lambda d: d["choices"][0]["message"].update(tool_calls=calls))

    async def mode_negusage(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        usage = {
            "prompt_tokens": -(10**9),
            "completion_tokens": -(10**9),
            "total_tokens": -2 * 10**9,
        }
        await self._bent(w, req, lambda d: d.update(usage=usage))

    async def mode_strusage(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        usage = {"prompt_tokens": "3", "completion_tokens": [1], "total_tokens": None}
        await self._bent(w, req, lambda d: d.update(usage=usage))

    async def mode_shortbody(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A Content-Length larger than the body, then the connection closes."""
        body = json.dumps(_completion(req.get("model", "m"), "short")).encode()
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body) + 100, body)
        )
        await w.drain()

    async def mode_fakegzip(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """`content-encoding: gzip` over a body that is not gzip."""
        body = json.dumps(_completion(req.get("model", "m"), "plain")).encode()
        await self._respond(w, 200, body, extra=[("content-encoding", "gzip")])

    async def mode_badstatus(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """Not HTTP at all after the request: a status line no parser takes."""
        w.write(b"HELLO THERE\r\n\r\n")
        await w.drain()

    # -- streams whose events are not what they claim -----------------------------------------

    async def _stream_with(self, w: asyncio.StreamWriter, req: dict, middle: list[bytes]) -> None:
        model = req.get("model", "m")
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "part"}),
            *middle,
            b"data: [DONE]\n\n",
        ]
        await self._sse(w, events)

    async def mode_doneonly(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._sse(w, [b"data: [DONE]\n\n"])

    async def mode_errorfield(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        err = b'event: error\ndata: {"type":"overloaded_error","message":"overloaded"}\n\n'
        await self._sse(w, [err, b"data: [DONE]\n\n"])

    async def mode_nonjsonmid(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._stream_with(w, req, [b"data: hello, not json\n\n"])

    async def mode_errorarray(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        await self._stream_with(w, req, [b'data: {"error": ["overloaded"]}\n\n'])

    async def mode_errorfieldmid(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        err = b'event: error\ndata: {"type":"overloaded_error","message":"overloaded"}\n\n'
        await self._stream_with(w, req, [err])

    async def mode_wrongchunk(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        bad = [b'data: {"foo": 1}\n\n', b'data: {"choices": [{"delta": {"content": 5}}]}\n\n']
        await self._stream_with(w, req, bad)

    async def mode_cutbrace(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """Cut JSON that happens to end in a brace."""
        await self._stream_with(
            w, req, [b'data: {"choices":[{"index":0,"delta":{"content":"x"}}\n\n']
        )

    async def mode_garbageafterfinish(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        model = req.get("model", "m")
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "abc"}),
            _chunk(model, {}, "stop"),
            b"data: garbage\n\n",
        ]
        await self._sse(w, events)

    # -- legal answers the translations must carry -------------------------------------------

    async def mode_refusal(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """The model refuses: `content` null and `refusal` set (streamed in two pieces)."""
        model = req.get("model", "m")
        if req.get("stream"):
            events = [
                _chunk(model, {"role": "assistant", "content": None, "refusal": ""}),
                _chunk(model, {"refusal": "I can't help "}),
                _chunk(model, {"refusal": "with that."}),
                _chunk(model, {}, "stop"),
                b"data: [DONE]\n\n",
            ]
            await self._sse(w, events)
            return
        doc = _completion(model, "x")
        doc["choices"][0]["message"].update(content=None, refusal="I can't help with that.")
        await self._respond(w, 200, json.dumps(doc).encode())

    async def mode_resetafterdone(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A whole answer, `[DONE]` included, then the connection drops without the chunked
        terminator (a proxy timing out the idle stream)."""
        model = req.get("model", "m")
        await self._start_chunked(w, "text/event-stream")
        for ev in (
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "whole"}),
            _chunk(model, {}, "stop"),
            b"data: [DONE]\n\n",
        ):
            await self._chunk_out(w, ev)
        w.transport.abort()

    async def mode_slow(self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str) -> None:
        """Answers after 3 s (a long generation)."""
        await asyncio.sleep(3.0)
        await self._ok(w, req, endpoint, "slow answer")

    # -- the key, disguised ------------------------------------------------------------------

    async def mode_splitkey(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """The key cut between two stream events, each redacted on its own."""
        model = req.get("model", "m")
        half = len(key) // 2
        events = [
            _chunk(model, {"role": "assistant", "content": ""}),
            _chunk(model, {"content": "key=" + key[:half]}),
            _chunk(model, {"content": key[half:] + " ok"}),
            _chunk(model, {}, "stop"),
            b"data: [DONE]\n\n",
        ]
        await self._sse(w, events, pause=0.02)

    async def mode_escapedkey(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """The key written as JSON escapes: no byte of it matches, the client decodes it."""
        escaped = "".join(f"\\u{ord(c):04x}" for c in key).encode()
        model = req.get("model", "m")
        if req.get("stream"):
            ev = _chunk(model, {"content": "key=KEYHERE"}).replace(b"KEYHERE", escaped)
            events = [_chunk(model, {"role": "assistant", "content": ""}), ev]
            await self._sse(w, [*events, _chunk(model, {}, "stop"), b"data: [DONE]\n\n"])
            return
        body = json.dumps(_completion(model, "key=KEYHERE")).encode()
        await self._respond(w, 200, body.replace(b"KEYHERE", escaped))

    async def mode_keyfields400(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        """A 400 quoting the key in its type, param and code, and without its prefix."""
        err = {
            "error": {
                "message": f"bad temperature (key part {key[3:]}, tail {key[-12:]})",
                "type": key[:20],
                "param": key,
                "code": key,
            }
        }
        await self._respond(w, 400, json.dumps(err).encode())

    async def mode_retryinf(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        body = json.dumps({"error": {"message": "slow down", "type": "rate_limit"}}).encode()
        await self._respond(w, 429, body, extra=[("retry-after", "inf")])

    async def mode_retryhuge(
        self, w: asyncio.StreamWriter, req: dict, endpoint: str, key: str
    ) -> None:
        body = json.dumps({"error": {"message": "slow down", "type": "rate_limit"}}).encode()
        await self._respond(w, 429, body, extra=[("retry-after", "1e12")])


@contextlib.contextmanager
def hostile_upstream() -> Iterator[HostileUpstream]:
    with HostileUpstream() as h:
        yield h
