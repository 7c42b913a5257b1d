"""Serve one chat or completion job through the engine: queue, prefill, decode, write.

Streams send their headers with the first token (so time to first byte = time to first token)
unless the profile sets ``early_headers`` (vLLM sends them at once). A stream cut by the
``cut_stream_after_chunks`` fault ends with a closed connection and no ``[DONE]``; one ended by
``end_stream_after_chunks`` ends cleanly, also without ``[DONE]``. Broken bodies, stalls and
trickles are written here too (see ``faults.py``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .engine import Overloaded
from .faults import PLAIN, Shape
from .http import Connection
from .jobs import Job
from .responses import DONE, ChatFormat, error_body, usage
from .text import join_words, word_ids

if TYPE_CHECKING:
    from .server import Instance


GARBAGE_JSON = b'{"id": "chatcmpl-x", "choices": [{"message": {"content": \x00\xff garbage ]]}'
HTML = (
    b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>"
    b"<body><h1>502 Bad Gateway</h1><p>upstream misconfigured</p></body></html>"
)


async def serve_job(
    inst: Instance, job: Job, fmt: ChatFormat, conn: Connection, shape: Shape = PLAIN
) -> None:
    """Run ``job`` on ``inst``'s engine and write the response to ``conn``."""
    if shape.broken in ("garbage_json", "html"):
        # Fast and wrong: what a misconfigured proxy or a crashed worker behind one answers.
        html = shape.broken == "html"
        conn.send(
            200,
            HTML if html else GARBAGE_JSON,
            content_type=b"text/html" if html else b"application/json",
        )
        inst.stats.count_status(200)
        return
    engine, stats = inst.engine, inst.stats
    if job.stream and inst.profile.early_headers:
        conn.start_stream()
    try:
        await engine.acquire()
    except Overloaded:
        stats.count_status(inst.profile.overload_status)
        stats.overloaded += 1
        body = error_body(
            "the server is overloaded, retry later", "server_error", None, "overloaded"
        )
        if conn.head_sent:
            conn.close()
        else:
            conn.send(inst.profile.overload_status, body, headers=b"retry-after: 1\r\n")
        return
    stats.active_peak = max(stats.active_peak, engine.active)
    try:
        cached = await engine.prefill(job.prompt_text, job.prompt_tokens)
        stats.prompt_tokens += job.prompt_tokens
        if job.stream:
            await _stream(inst, job, fmt, conn, cached, shape)
        else:
            await _whole(inst, job, fmt, conn, cached, shape)
    except asyncio.CancelledError:
        stats.disconnects += 1
        raise
    finally:
        engine.release()


def _cut_at(inst: Instance) -> int | None:
    return inst.faults.faults.cut_stream_after_chunks


async def stall_forever() -> None:
    """Keep the connection open and silent until the client gives up (the task is cancelled)."""
    await asyncio.Event().wait()


async def trickle(conn: Connection, data: bytes, rate: float, chunked: bool) -> None:
    """Write ``data`` a few bytes at a time at ``rate`` bytes/s."""
    piece = max(1, int(rate / 10))
    for i in range(0, len(data), piece):
        part = data[i : i + piece]
        if chunked:
            conn.write_chunk(part)
        else:
            conn.write_raw(part)
        await asyncio.sleep(len(part) / rate)


async def _stream(
    inst: Instance, job: Job, fmt: ChatFormat, conn: Connection, cached: int, shape: Shape
) -> None:
    f = inst.faults.faults
    cut = _cut_at(inst)
    end_at, stall_at, rate = f.end_stream_after_chunks, f.stall_after_chunks, f.trickle_bytes_per_s
    if not conn.head_sent:
        conn.start_stream()
    plan = job.plan
    ids = [] if plan is not None else word_ids(job.seed, job.start, job.n_out)
    out = fmt.plan_start(plan) if plan is not None else fmt.role_chunk("")
    if shape.broken == "truncated_json":
        if plan is not None:
            event = fmt.plan_pieces(plan, 0, 1)
        else:
            event = fmt.words(ids[:1], job.first) if ids else fmt.final_chunk(job.finish)
        conn.write_chunk(out + event[: len(event) // 2] + b"\n\n")
        conn.end_stream()
        inst.stats.count_status(200)
        return
    sent = 0
    n_first = min(1, job.n_out)
    limits = [x for x in (cut, end_at, stall_at) if x is not None]
    stop_at = min(limits) if limits else None

    async def write(data: bytes) -> None:
        if rate:
            await trickle(conn, data, rate, chunked=True)
        else:
            conn.write_chunk(data)

    async def emit(k: int) -> bool:
        """Write ``k`` more content chunks; False when a fault ended the stream here."""
        nonlocal out, sent
        if stop_at is not None and sent + k > stop_at:
            k = stop_at - sent
        if plan is not None:
            out += fmt.plan_pieces(plan, sent, sent + k)
        elif k:
            out += fmt.words(ids[sent : sent + k], job.first and sent == 0)
        sent += k
        await write(out)
        out = b""
        if stop_at is None or sent < stop_at or sent >= job.n_out:
            return True
        if sent == cut:
            inst.faults.count("cut_stream")
            conn.close()
        elif sent == end_at:
            inst.faults.count("end_stream_early")
            conn.end_stream()  # a clean end of the body: no finish chunk, no [DONE]
            inst.stats.count_status(200)
        else:
            inst.faults.count("stall")
            await stall_forever()
        return False

    if not await emit(n_first):
        return
    async for k in inst.engine.decode(job.n_out - n_first):
        if not await emit(k):
            return
    inst.stats.completion_tokens += job.out_tokens
    tail = fmt.final_chunk(job.finish) if plan is None else b""
    if job.include_usage:
        tail += fmt.usage_chunk(usage(job.prompt_tokens, job.out_tokens, cached))
    await write(tail + DONE)
    conn.end_stream()
    inst.stats.count_status(200)


async def _whole(
    inst: Instance, job: Job, fmt: ChatFormat, conn: Connection, cached: int, shape: Shape
) -> None:
    async for _ in inst.engine.decode(job.n_out - min(1, job.n_out)):
        pass
    inst.stats.completion_tokens += job.out_tokens
    u = usage(job.prompt_tokens, job.out_tokens, cached)
    if job.plan is not None:
        body = fmt.plan_body(job.plan, u)
    else:
        text = join_words(word_ids(job.seed, job.start, job.n_out), job.first)
        body = fmt.body(text, job.finish, u)
    f = inst.faults.faults
    if _cut_at(inst) is not None:
        inst.faults.count("cut_stream")
        conn.send_partial(200, body, len(body) // 2)
        return
    if shape.broken == "truncated_json":
        conn.send(200, body[: len(body) // 2])  # complete framing, cut JSON
        inst.stats.count_status(200)
        return
    if f.stall_after_chunks is not None:
        inst.faults.count("stall")
        conn.send_head(200, len(body))
        await stall_forever()
    if f.trickle_bytes_per_s:
        conn.send_head(200, len(body))
        await trickle(conn, body, f.trickle_bytes_per_s, chunked=False)
        conn.finish()
    else:
        conn.send(200, body)
    inst.stats.count_status(200)
