"""Replay a recorded traffic file with its timing.

Format: JSON Lines, one request per line, sorted or not::

    {"offset": 0.00, "prompt_tokens": 120, "max_tokens": 64, "stream": true}
    {"offset": 0.35, "prompt": "Summarise this...", "max_tokens": 200}
    {"offset": 0.90, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "model": "m"}

``offset`` is seconds from the start; ``prompt_tokens`` makes a synthetic prompt of that size;
``stream`` and ``model`` default to the command line's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson

from .client import Sample
from .measures import timeline
from .modes import _lateness_note, run_open
from .prompts import make_prompt
from .result import Bench, Result


@dataclass(frozen=True, slots=True)
class Entry:
    offset: float
    body: bytes
    stream: bool


def load_entries(
    path: Path, model: str, stream: bool, max_tokens: int, seed: int = 0, limit: int | None = None
) -> list[Entry]:
    """Parse and sort a traffic file; bodies are built once, before the clock starts."""
    rng = random.Random(seed)
    entries: list[Entry] = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        rec = orjson.loads(line)
        if "offset" not in rec:
            raise ValueError(f"{path}:{n}: missing 'offset'")
        if "messages" in rec:
            messages = rec["messages"]
        else:
            text = rec.get("prompt") or make_prompt(int(rec.get("prompt_tokens", 100)), rng)
            messages = [{"role": "user", "content": text}]
        is_stream = bool(rec.get("stream", stream))
        body: dict[str, object] = {
            "model": rec.get("model", model),
            "messages": messages,
            "max_tokens": int(rec.get("max_tokens", max_tokens)),
            "stream": is_stream,
            "temperature": 0,
        }
        if is_stream:
            body["stream_options"] = {"include_usage": True}
        entries.append(Entry(float(rec["offset"]), orjson.dumps(body), is_stream))
    entries.sort(key=lambda e: e.offset)
    return entries[:limit] if limit is not None else entries


async def replay(
    b: Bench,
    path: Path,
    speed: float = 1.0,
    limit: int | None = None,
    max_inflight: int = 4096,
    window_s: float = 1.0,
) -> Result:
    """Send every entry at ``offset / speed`` (open loop, latency from the scheduled time)."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    limit = min(limit or b.max_requests, b.max_requests)
    entries = load_entries(
        path, b.factory.model, b.stream, b.factory.max_tokens, b.factory.seed, limit
    )
    if not entries:
        raise ValueError(f"{path} holds no requests")
    base = entries[0].offset
    offsets = [(e.offset - base) / speed for e in entries]
    target = b.targets[0]

    async def fire(i: int, scheduled: float) -> Sample:
        e = entries[i]
        return await b.client.send(target, e.body, e.stream, scheduled, "replay")

    samples, row, t0 = await run_open(b, offsets, "replay", max_inflight, fire)
    cfg = {"file": str(path), "speed": speed, "requests": len(entries)}
    res = Result("replay", cfg, samples=samples, t0=t0)
    res.tables["replay"] = [row]
    res.tables["timeline"] = timeline(samples, t0, window_s)
    _lateness_note(res, row)
    return res
