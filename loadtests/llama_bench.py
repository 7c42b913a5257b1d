"""Prefix affinity on real KV caches: time to first token with affinity, P2C only, round-robin.

``python -m loadtests.llama_bench [--rate 0.3] [--requests 30] [--prompts 4] [--prefix-tokens 900]``

Each contender gets two fresh llama.cpp servers (SmolLM2-135M, 1 CPU thread, 2 slots of 2048
tokens each, so every one starts cold) and a ``gateway serve`` process with
``policies/real-local.yaml`` changed in the pool's routing only, plus what every contender
shares: the exact-answer cache off, a gateway queue instead of shedding, and timeouts long
enough that overload shows as time to first token rather than as timeouts and retries.
The same seeded workload goes to each: Poisson arrivals, each request one of a few long system
prompts plus a short question, streamed with usage. Reported per contender: mean and p99 time to
first token (from the scheduled send time, so queueing counts), the share of prompt tokens the
servers found in their KV cache, and the share of requests whose cached tokens covered the
system prompt.

The servers run with ``cache_ram_mib=0``: llama.cpp otherwise restores evicted prompts from a
host-RAM copy, which hides what routing does to the slots' own KV caches (as on a GPU server
without host offload). The system prompts are chosen so that the affinity contender places half
of them on each server: the placement is learnt from the gateway itself (its
``x-gateway-provider`` header for one request per prompt, the affinity policy served over one
probe server under both names), not computed with the gateway's own hash. The first lines of
the output show it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from loadtests.bench.schedule import poisson_times
from loadtests.bench.stats import summarize
from loadtests.llama.launcher import LlamaInstance, start_instances, stop_all

POLICY = Path(__file__).resolve().parent.parent / "policies" / "real-local.yaml"
NAMES = ("llama-a", "llama-b")
CONTENDERS: dict[str, dict[str, Any]] = {
    "affinity + P2C": {},  # policies/real-local.yaml as shipped
    "P2C only": {"affinity": {"enabled": False}},
    "round-robin": {"affinity": {"enabled": False}, "balancer": {"strategy": "round_robin"}},
}
SENTENCES = [
    "Every request is routed to one of several upstream servers.",
    "The router estimates the prompt's size and the expected output before it picks a server.",
    "A server that fails is skipped for a while and probed again later.",
    "When all servers are busy, new requests wait in a bounded queue or are shed.",
    "Operators change the routing policy without restarting anything.",
    "Answers that are deterministic may be served from a cache.",
    "Long conversations keep going to the server that already holds their context.",
]
QUESTIONS = [
    "What happens when a server fails?",
    "How is a server picked?",
    "Can the policy change at run time?",
    "What is cached?",
    "What if every server is busy?",
    "Why do conversations stick to one server?",
]


@dataclass
class Sample:
    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int
    prefix_tokens: int
    provider: str
    error: str | None = None


def system_prompt(c: httpx.Client, inst: LlamaInstance, topic: str, tokens: int) -> str:
    text, i = f"You are the assistant of {topic}. Follow these rules.", 0
    while _count(c, inst, text) < tokens:
        text += f" Rule {i}: {SENTENCES[i % len(SENTENCES)]}"
        i += 1
    return text


def _count(c: httpx.Client, inst: LlamaInstance, text: str) -> int:
    return len(c.post(f"{inst.base_url}/tokenize", json={"content": text}).json()["tokens"])


def _owner(gw: httpx.Client, system: str) -> str:
    """The member the gateway picks for this system prompt (idle gateway: the affinity owner)."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
        "temperature": 0,
        "max_tokens": 1,
    }
    r = gw.post("/chat/completions", json=body)
    r.raise_for_status()
    owner = r.headers.get("x-gateway-provider", "")
    if owner not in NAMES:
        raise RuntimeError(f"the gateway named no known provider: {owner!r}")
    return owner


def build_prompts(
    inst: LlamaInstance, n: int, tokens: int, folder: Path
) -> list[tuple[str, int, str]]:
    """``n`` system prompts, half owned by each server: (text, tokens, owner).

    The owner is what the affinity contender's gateway answers with, asked once per prompt while
    idle; both of its providers point at ``inst`` (routing looks at names, not at URLs).
    """
    per_owner = {name: 0 for name in NAMES}
    out: list[tuple[str, int, str]] = []
    policy = write_policy(folder, "placement", CONTENDERS["affinity + P2C"])
    port = 18_000 + random.randrange(2000)
    proc = start_gateway(policy, [inst.url, inst.url], port)
    try:
        with (
            httpx.Client(timeout=30) as c,
            httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=60) as gw,
        ):
            for i in range(200):
                text = system_prompt(c, inst, f"product line {i}", tokens)
                owner = _owner(gw, text)
                if per_owner[owner] >= (n + 1) // 2:
                    continue
                per_owner[owner] += 1
                out.append((text, _count(c, inst, text), owner))
                if len(out) == n:
                    return out
    finally:
        proc.terminate()
        proc.wait(10)
    raise RuntimeError("could not place the prompts evenly")


def write_policy(folder: Path, name: str, pool_edits: dict[str, Any]) -> Path:
    doc = yaml.safe_load(POLICY.read_text())
    doc["models"]["smollm2"]["cache"] = {"exact": {"enabled": False}}
    doc["pools"]["local"].update(pool_edits)
    # Requests beyond the servers' 4 in flight wait in the gateway instead of being shed.
    doc["pools"]["local"]["queue"] = {"max_wait_s": 150.0}
    for provider in doc["providers"].values():
        # Long enough that an overloaded contender shows its queueing as time to first token
        # instead of timeouts and retries (which would add load on the other server).
        provider["timeouts"] = {
            "connect_s": 1.0,
            "first_byte_s": 150.0,
            "idle_s": 150.0,
            "total_s": 180.0,
        }
    path = folder / f"{name.replace(' ', '').replace('+', '-')}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start_gateway(policy: Path, urls: list[str], port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LLAMA_URL_A": urls[0], "LLAMA_URL_B": urls[1]}
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(policy)]
    cmd += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the gateway did not start")


async def one(
    client: httpx.AsyncClient, t0: float, at: float, system: str, prefix: int, question: str
) -> Sample:
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ttft, usage, provider = None, None, ""
    try:
        async with client.stream("POST", "/chat/completions", json=body) as r:
            provider = r.headers.get("x-gateway-provider", "")
            if r.status_code != 200:
                detail = orjson.loads(await r.aread()).get("error", {}).get("code")
                return Sample(None, 0, 0, prefix, provider, f"HTTP {r.status_code} {detail}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if "error" in chunk:  # the gateway ends a broken stream with an error event
                    return Sample(
                        None, 0, 0, prefix, provider, f"stream {chunk['error'].get('code')}"
                    )
                choices = chunk.get("choices") or []
                if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - (t0 + at)
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as exc:
        return Sample(None, 0, 0, prefix, provider, type(exc).__name__)
    if ttft is None:
        return Sample(None, 0, 0, prefix, provider, "no content")
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Sample(ttft, usage.get("prompt_tokens", 0), cached, prefix, provider)


async def drive(url: str, workload: list[tuple[float, str, int, str]]) -> list[Sample]:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=url, timeout=180, limits=limits) as client:
        t0 = time.perf_counter() + 0.2
        return list(await asyncio.gather(*(one(client, t0, *w) for w in workload)))


def run_contender(
    name: str, edits: dict[str, Any], workload: list[tuple[float, str, int, str]], folder: Path
) -> dict[str, Any]:
    instances = start_instances(2, threads=1, slots=2, ctx_size=2048, cache_ram_mib=0)
    port = 18_000 + random.randrange(2000)
    proc = start_gateway(write_policy(folder, name, edits), [i.url for i in instances], port)
    try:
        t = time.perf_counter()
        samples = asyncio.run(drive(f"http://127.0.0.1:{port}/v1", workload))
        wall = time.perf_counter() - t
    finally:
        proc.terminate()
        proc.wait(10)
        stop_all(instances)
    ok = [s for s in samples if s.error is None]
    ttft = summarize([s.ttft_s for s in ok if s.ttft_s is not None])
    prompt = sum(s.prompt_tokens for s in ok)
    return {
        "contender": name,
        "ok": len(ok),
        "errors": len(samples) - len(ok),
        "ttft_mean_s": ttft.mean,
        "ttft_p50_s": ttft.p50,
        "ttft_p99_s": ttft.p99,
        "cached_token_share": sum(s.cached_tokens for s in ok) / prompt if prompt else 0.0,
        "prefix_hit_share": sum(s.cached_tokens >= 0.9 * s.prefix_tokens for s in ok) / len(ok)
        if ok
        else 0.0,
        "per_server": {n: sum(s.provider == n for s in ok) for n in NAMES},
        "error_kinds": dict(Counter(s.error for s in samples if s.error is not None)),
        "wall_s": wall,
    }


def table(rows: list[dict[str, Any]]) -> str:
    ref = rows[0]["ttft_mean_s"]
    out = [
        "| routing | ok / errors | mean TTFT | p50 TTFT | p99 TTFT | mean vs affinity | "
        "cached prompt tokens | requests with prefix cached | per server (a/b) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ps = r["per_server"]
        out.append(
            f"| {r['contender']} | {r['ok']} / {r['errors']} | {r['ttft_mean_s']:.2f} s | "
            f"{r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s | "
            f"{r['ttft_mean_s'] / ref:.2f}x | {r['cached_token_share']:.0%} | "
            f"{r['prefix_hit_share']:.0%} | {ps['llama-a']}/{ps['llama-b']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.llama_bench", description=__doc__)
    ap.add_argument("--rate", type=float, default=0.3, help="arrivals per second (Poisson)")
    ap.add_argument("--requests", type=int, default=30, help="requests per contender")
    ap.add_argument("--prompts", type=int, default=4, help="distinct system prompts")
    ap.add_argument("--prefix-tokens", type=int, default=900, help="tokens per system prompt")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory(prefix="llama-bench-") as folder:
        probe = start_instances(1, threads=1, slots=1, ctx_size=2048)
        try:
            prompts = build_prompts(probe[0], args.prompts, args.prefix_tokens, Path(folder))
        finally:
            stop_all(probe)
        for i, (_, n, owner) in enumerate(prompts):
            print(f"system prompt {i}: {n} tokens, affinity owner {owner}", flush=True)
        rng = random.Random(args.seed)
        times = poisson_times(args.rate, count=args.requests, seed=args.seed)
        workload = []
        for k, at in enumerate(times):
            text, n, _ = prompts[rng.randrange(len(prompts))]
            workload.append((at, text, n, f"Question {k}: {QUESTIONS[k % len(QUESTIONS)]}"))
        for name in args.contenders.split(","):
            edits = CONTENDERS[name]
            row = run_contender(name, edits, workload, Path(folder))
            errors = f", errors: {row['error_kinds']}" if row["error_kinds"] else ""
            print(f"{name}: done in {row['wall_s']:.0f} s{errors}", flush=True)
            rows.append(row)
    print(
        f"\n{args.requests} requests at {args.rate}/s (Poisson, seed {args.seed}), "
        f"{args.prompts} system prompts of ~{args.prefix_tokens} tokens, 8 output tokens; "
        "2 llama.cpp servers, 1 thread and 2 slots each\n"
    )
    print(table(rows))
    if args.out:
        args.out.write_text(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
