"""Serve one chat or completion job through the engine: queue, prefill, decode, write.

Streams send their headers with the first token (so time to first byte = time to first token)
unless the profile sets ``early_headers`` (vLLM sends them at once). A stream cut by the
``cut_stream_after_chunks`` fault ends with a closed connection and no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .engine import Overloaded
from .http import Connection
from .jobs import Job
from .responses import DONE, ChatFormat, error_body, usage
from .text import join_words, word_ids

if TYPE_CHECKING:
    from .server import Instance


async def serve_job(inst: Instance, job: Job, fmt: ChatFormat, conn: Connection) -> None:
    """Run ``job`` on ``inst``'s engine and write the response to ``conn``."""
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
            await _stream(inst, job, fmt, conn, cached)
        else:
            await _whole(inst, job, fmt, conn, cached)
    except asyncio.CancelledError:
        stats.disconnects += 1
        raise
    finally:
        engine.release()


def _cut_at(inst: Instance) -> int | None:
    return inst.faults.faults.cut_stream_after_chunks


async def _stream(inst: Instance, job: Job, fmt: ChatFormat, conn: Connection, cached: int) -> None:
    cut = _cut_at(inst)
    if not conn.head_sent:
        conn.start_stream()
    ids = [] if job.tool else word_ids(job.seed, job.start, job.n_out)
    args = job.tool["function"]["arguments"] if job.tool else ""
    if job.tool:
        head_call = {
            **job.tool,
            "function": {"name": job.tool["function"]["name"], "arguments": ""},
        }
        out = fmt.role_chunk(None) + fmt.tool_chunk(head_call)
    else:
        out = fmt.role_chunk("")
    sent = 0
    n_first = min(1, job.n_out)

    def emit(k: int) -> bool:
        """Write ``k`` more content chunks; False when the cut fault closed the stream."""
        nonlocal out, sent
        if cut is not None and sent + k > cut:
            k = cut - sent
        if job.tool:
            pieces = [_slice(args, job.n_out, sent + j) for j in range(k)]
            out += b"".join(fmt.tool_chunk({"function": {"arguments": p}}) for p in pieces if p)
        elif k:
            out += fmt.words(ids[sent : sent + k], job.first and sent == 0)
        sent += k
        conn.write_chunk(out)
        out = b""
        if cut is not None and sent >= cut and sent < job.n_out:
            inst.faults.count("cut_stream")
            conn.close()
            return False
        return True

    if not emit(n_first):
        return
    async for k in inst.engine.decode(job.n_out - n_first):
        if not emit(k):
            return
    inst.stats.completion_tokens += job.n_out
    tail = fmt.final_chunk(job.finish)
    if job.include_usage:
        tail += fmt.usage_chunk(usage(job.prompt_tokens, job.n_out, cached))
    conn.write_chunk(tail + DONE)
    conn.end_stream()
    inst.stats.count_status(200)


def _slice(args: str, n: int, j: int) -> str:
    """The ``j``-th of ``n`` nearly equal pieces of the tool-call arguments."""
    size = len(args)
    return args[size * j // n : size * (j + 1) // n]


async def _whole(inst: Instance, job: Job, fmt: ChatFormat, conn: Connection, cached: int) -> None:
    async for _ in inst.engine.decode(job.n_out - min(1, job.n_out)):
        pass
    inst.stats.completion_tokens += job.n_out
    u = usage(job.prompt_tokens, job.n_out, cached)
    if job.tool:
        body = fmt.body(None, job.finish, u, [job.tool])
    else:
        text = join_words(word_ids(job.seed, job.start, job.n_out), job.first)
        body = fmt.body(text, job.finish, u)
    if _cut_at(inst) is not None:
        inst.faults.count("cut_stream")
        conn.send_partial(200, body, len(body) // 2)
        return
    conn.send(200, body)
    inst.stats.count_status(200)
