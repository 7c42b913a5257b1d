"""Semantic cache with the real embedding model, a real FAISS search and a real Redis."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

pytest.importorskip("faiss")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.cache.async_embedder import AsyncEmbedder, More  # noqa: E402
from gateway.cache.embedder import make_embedder  # noqa: E402
from gateway.cache.semantic import (  # noqa: E402
    SemanticCache,
    last_user_text,
    namespace_for,
)
from gateway.cache.semantic_settings import SemanticSettings  # noqa: E402
from tests.cache.test_shared_context import threads_idle  # noqa: E402
from tests.conftest import REDIS_URL  # noqa: E402  (this worker's database)

NS = "t1\x1fgpt\x1fctx"


@pytest.fixture(scope="module")
def worker() -> Iterator[AsyncEmbedder]:
    """One model load for the whole module; each cache gets its own index on this thread."""
    kind = os.environ.get("GATEWAY_TEST_EMBEDDER", "auto")  # auto: ONNX when installed
    w = AsyncEmbedder(make_embedder(kind), batch_max=32, queue_max=256)  # type: ignore[arg-type]
    yield w
    w.close()


def _settings(**kw: object) -> SemanticSettings:
    prefix = f"test:sem:{uuid.uuid4().hex[:8]}:"
    base: dict[str, object] = {"redis_prefix": prefix, "redis_channel": prefix + "chan"}
    base.update(kw)
    return SemanticSettings.model_validate(base)


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    r = Redis.from_url(REDIS_URL)
    try:
        await r.ping()
    except Exception:
        pytest.skip(f"Redis not running at {REDIS_URL}")
    yield r
    keys = [k async for k in r.scan_iter(match="test:sem:*", count=1000)]
    if keys:
        await r.delete(*keys)
    await r.aclose()


async def test_paraphrase_hits_and_unrelated_misses(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    await cache.store(NS, "How do I reset my password?", b"answer-1")
    res = await cache.lookup(NS, "How can I reset my password?")
    assert res.outcome == "hit" and res.hit is not None
    assert res.hit.response == b"answer-1" and res.hit.question == "How do I reset my password?"
    assert cache.verifier is not None and res.hit.similarity >= cache.verifier.retrieval_floor
    loose = await cache.lookup(NS, "I forgot my password, how can I change it?", threshold=0.85)
    assert loose.outcome == "hit"
    miss = await cache.lookup(NS, "What's the weather in Paris?")
    assert miss.outcome == "miss" and miss.similarity is not None and miss.similarity < 0.3


async def test_candidates_far_below_the_closest_are_not_judged(worker: AsyncEmbedder) -> None:
    """`judge_margin`: in a crowded namespace only candidates near the closest are judged."""
    stored = ["How do I reset my password?", "How do I change my password?",
              "How can I recover my account?"]  # fmt: skip
    asked = "How can I reset my password?"  # cosines ~0.99, ~0.85, ~0.68 (all above the floor)
    judged: dict[float, list[str]] = {}
    for margin in (1.0, 0.10):
        cache = SemanticCache(_settings(judge_margin=margin), worker=worker)
        for i, text in enumerate(stored):
            await cache.store(NS, text, f"answer-{i}".encode())
        assert cache.verifier is not None
        seen: list[str] = []
        real = cache.verifier.pair_probabilities

        def spy(pairs, real=real, seen=seen):  # type: ignore[no-untyped-def]
            seen.extend(c for _, c, _ in pairs)
            return real(pairs)

        cache.verifier.pair_probabilities = spy  # type: ignore[method-assign]
        try:
            res = await cache.lookup(NS, asked)
        finally:
            del cache.verifier.pair_probabilities
        assert res.outcome == "hit" and res.hit is not None and res.hit.response == b"answer-0"
        judged[margin] = seen
    assert sorted(judged[1.0]) == sorted(stored)
    assert judged[0.10] == ["How do I reset my password?"]


NEAR_MISSES = [
    ("How many calories are in 2 eggs?", "How many calories are in 3 eggs?", "number"),
    ("Is it safe to drink coffee while pregnant?", "Is it not safe to drink coffee while pregnant?",
     "negation"),
    ("How do I install Docker on Ubuntu?", "How do I install Docker on Debian?", "entity"),
    ("Is Python faster than Java?", "Is Java faster than Python?", "entity_order"),
]  # fmt: skip


@pytest.mark.parametrize(("stored", "asked", "reason"), NEAR_MISSES)
async def test_near_misses_rejected_by_the_verifier(
    worker: AsyncEmbedder, stored: str, asked: str, reason: str
) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    await cache.store(NS, stored, b"x")
    res = await cache.lookup(NS, asked)
    assert res.outcome == "rejected" and res.reason == "verifier" and res.hit is None
    assert res.similarity is not None and res.similarity > 0.8  # the embedding alone would serve it
    assert (await cache.lookup(NS, stored)).outcome == "hit"  # a text always matches itself


# The order of two things joined by "and"/"or"/"vs" is not the question ("the difference between
# TCP and UDP"); the order of two roles is ("from X to Y", "X beat Y"), and so is an operator's
# place in code. (These were written for this test, not taken from the training files.)
SAME_IN_ANOTHER_ORDER = [
    ("What is the difference between TCP and UDP?", "What is the difference between UDP and TCP?"),
    ("AWS vs Azure for a small startup?", "Azure vs AWS for a small startup?"),
    ("How far apart are Tokyo and Osaka?", "How far apart are Osaka and Tokyo?"),
]
ROLES_SWAPPED = [
    ("Did France invade England in 1066?", "Did England invade France in 1066?"),
    ("How do I export contacts from Outlook to Gmail?",
     "How do I export contacts from Gmail to Outlook?"),
    ("Why does `x == None` fail but `x is None` works?",
     "Why does `x is None` fail but `x == None` works?"),
    ("How do I keep rows where price >= 100 in pandas?",
     "How do I keep rows where price > 100 in pandas?"),
]  # fmt: skip


@pytest.mark.parametrize(("stored", "asked"), SAME_IN_ANOTHER_ORDER)
async def test_coordinated_things_in_another_order_are_served(
    worker: AsyncEmbedder, stored: str, asked: str
) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    await cache.store(NS, stored, b"x")
    assert (await cache.lookup(NS, asked)).outcome == "hit"


@pytest.mark.parametrize(("stored", "asked"), ROLES_SWAPPED)
async def test_swapped_roles_and_operators_are_refused(
    worker: AsyncEmbedder, stored: str, asked: str
) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    await cache.store(NS, stored, b"x")
    res = await cache.lookup(NS, asked)
    assert res.outcome == "rejected" and res.reason == "verifier"


@pytest.mark.parametrize(("stored", "asked", "reason"), NEAR_MISSES)
async def test_near_misses_rejected_by_guards(
    worker: AsyncEmbedder, stored: str, asked: str, reason: str
) -> None:
    cache = SemanticCache(_settings(matcher="guards"), worker=worker)
    await cache.store(NS, stored, b"x")
    res = await cache.lookup(NS, asked, threshold=0.5)
    assert res.outcome == "rejected" and res.reason == reason and res.hit is None
    assert res.similarity is not None and res.similarity > 0.8  # the embedding alone would serve it


async def test_guard_rejection_falls_through_to_next_candidate(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(_settings(threshold=0.7, matcher="guards"), worker=worker)
    await cache.store(NS, "How many calories are in 3 eggs?", b"three")
    await cache.store(NS, "How many calories do 2 eggs have?", b"two")
    res = await cache.lookup(NS, "How many calories are in 2 eggs?")
    assert res.outcome == "hit" and res.hit is not None and res.hit.response == b"two"


def test_namespace_covers_context_not_last_turn() -> None:
    sys_a = {"role": "system", "content": "You are a travel agent."}
    turns_norway = [sys_a, {"role": "user", "content": "Tell me about Norway"},
                    {"role": "assistant", "content": "Norway is..."}]  # fmt: skip
    turns_peru = [sys_a, {"role": "user", "content": "Tell me about Peru"},
                  {"role": "assistant", "content": "Peru is..."}]  # fmt: skip
    q1 = {"role": "user", "content": "What about in winter?"}
    q2 = {"role": "user", "content": [{"type": "text", "text": "And in winter?"}]}
    assert namespace_for("t", "m", [*turns_norway, q1]) == namespace_for(
        "t", "m", [*turns_norway, q2]
    )
    assert namespace_for("t", "m", [*turns_norway, q1]) != namespace_for(
        "t", "m", [*turns_peru, q1]
    )
    assert namespace_for("t", "m", [q1]) != namespace_for("u", "m", [q1])
    assert namespace_for("t", "m", [q1]) != namespace_for("t", "m2", [q1])
    assert namespace_for("t", "m", [q1]) != namespace_for(
        "t", "m", [q1], {"response_format": {"type": "json_object"}}
    )
    assert last_user_text([*turns_norway, q2]) == "And in winter?"
    assert last_user_text(turns_norway) is None  # ends with an assistant turn
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert last_user_text([image]) is None


async def test_no_hit_across_namespaces(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    history = [
        {"role": "user", "content": "Tell me about Norway"},
        {"role": "assistant", "content": "..."},
    ]
    other = [
        {"role": "user", "content": "Tell me about Peru"},
        {"role": "assistant", "content": "..."},
    ]
    q = {"role": "user", "content": "What is the weather like in winter?"}
    ns = namespace_for("acme", "chat", [*history, q])
    await cache.store(ns, "What is the weather like in winter?", b"cold")
    assert (await cache.lookup(ns, "What's the weather like in winter?")).outcome == "hit"
    for other_ns in (
        namespace_for("acme", "chat", [*other, q]),
        namespace_for("globex", "chat", [*history, q]),
        namespace_for("acme", "chat-large", [*history, q]),
    ):
        assert (
            await cache.lookup(other_ns, "What is the weather like in winter?")
        ).outcome == "miss"


async def test_ttl_expiry(worker: AsyncEmbedder) -> None:
    now = [1000.0]
    cache = SemanticCache(_settings(), worker=worker, clock=lambda: now[0])
    await cache.store(NS, "How do I bake sourdough bread?", b"bread", ttl_s=60)
    assert (await cache.lookup(NS, "How do I bake sourdough bread?")).outcome == "hit"
    now[0] += 61
    assert (await cache.lookup(NS, "How do I bake sourdough bread?")).outcome == "miss"
    assert len(cache.index) == 0 and cache.stats()["expired"] == 1


async def test_memory_bound_evicts_least_recently_used(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(_settings(max_entries=3), worker=worker)
    questions = ["How do I learn to swim?", "What is a black hole?", "How do vaccines work?"]
    for i, q in enumerate(questions):
        await cache.store(NS, q, f"a{i}".encode())
    assert (await cache.lookup(NS, questions[0])).outcome == "hit"  # now most recently used
    await cache.store(NS, "Why is the sky blue?", b"a3")
    assert len(cache.index) == 3 and cache.stats()["evicted"] == 1
    assert (await cache.lookup(NS, questions[1])).outcome == "miss"
    assert (await cache.lookup(NS, questions[0])).outcome == "hit"
    # Three entries (their allocator allowance included) and the word gate's smallest table.
    bound = 3 * (2 * 1536 + 256 + 1100 + 700) + 1024
    small = SemanticCache(_settings(max_bytes=bound), worker=worker)
    for i, q in enumerate([*questions, "Why is the sky blue?"]):
        await small.store(NS, q, bytes(1000 + i))
    assert len(small.index) == 3 and small.index.nbytes <= small.settings.max_bytes


async def test_too_long_question_is_not_cached(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    long_q = "Please summarise this: " + "lorem ipsum dolor sit amet " * 60
    assert await cache.store(NS, long_q, b"x") is False
    await cache.store(NS, "A short question?", b"y")  # so the lookup below searches
    res = await cache.lookup(NS, long_q)
    assert res.outcome == "skipped" and res.reason == "too_long"


async def test_concurrent_lookups_are_batched(worker: AsyncEmbedder) -> None:
    before = worker.batches
    vecs = await asyncio.gather(*(worker.embed([f"question number {i}"]) for i in range(24)))
    assert all(v.shape == (1, 384) for v in vecs)
    assert worker.batches - before < 24


async def test_rebuild_from_redis_after_restart(worker: AsyncEmbedder, redis: Redis) -> None:
    settings = _settings()
    first = SemanticCache(settings, redis=redis, worker=worker)
    await first.start()
    assert await first.store(NS, "How do I reset my password?", b"pw", ttl_s=30)
    await first.flush()
    await first.aclose()
    assert await redis.pttl(settings.redis_prefix + next(iter(first.index._entries))) > 20_000
    second = SemanticCache(settings, redis=redis, worker=worker)
    await second.start()
    try:
        assert len(second.index) == 1
        res = await second.lookup(NS, "How can I reset my password?")
        assert res.outcome == "hit" and res.hit is not None and res.hit.response == b"pw"
    finally:
        await second.aclose()


async def test_pubsub_propagates_between_replicas(worker: AsyncEmbedder, redis: Redis) -> None:
    settings = _settings()
    a = SemanticCache(settings, redis=redis, worker=worker)
    b = SemanticCache(settings, redis=Redis.from_url(REDIS_URL), worker=worker)
    await a.start()
    await b.start()
    try:
        await a.store(NS, "What is the boiling point of water?", b"100C")
        for _ in range(100):
            if len(b.index) == 1:
                break
            await asyncio.sleep(0.02)
        res = await b.lookup(NS, "What's the boiling point of water?")
        assert res.outcome == "hit" and res.hit is not None and res.hit.response == b"100C"
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_down_degrades_to_memory(worker: AsyncEmbedder) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block exits: nothing listens there
    # No retries: redis-py's default (10 retries with backoff) takes ~4 s to fail per call.
    dead = Redis(host="127.0.0.1", port=port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    cache = SemanticCache(_settings(), redis=dead, worker=worker)
    await cache.start(wait_s=5)
    try:
        assert await cache.rebuild_from_redis() == 0
        assert await cache.store(NS, "How do I reset my password?", b"pw") is True
        await cache.flush()
        res = await cache.lookup(NS, "How can I reset my password?")
        assert res.outcome == "hit"
        assert cache.stats()["redis_errors"] >= 1
    finally:
        await cache.aclose()
        await dead.aclose()


def test_one_entry_namespaces_are_counted_and_bounded() -> None:
    """Every conversation is its own namespace: their matrices count against max_bytes."""
    import tracemalloc

    from gateway.cache.semantic_index import Entry, SemanticIndex

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((6000, 384)).astype(np.float32)
    texts = [f"What should I pack for trip number {i}?" for i in range(len(vecs))]
    bound = 4_000_000
    index = SemanticIndex(384, 10**6, bound)
    tracemalloc.start()
    for i, (text, vec) in enumerate(zip(texts, vecs, strict=True)):
        ns = f"t\x1fchat\x1f{i:024x}"
        index.add(Entry(f"{i:032x}", ns, text, vec, b"x" * 300, 1e12), 0.0)
        assert index.nbytes <= bound
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert index.evicted > 0 and index.namespaces == len(index)  # evicted namespaces are gone
    # what the index really holds is no more than what it counts (texts were allocated before)
    assert traced <= index.nbytes
    for entry_id in list(index._entries):
        index.remove(entry_id)
    assert index.nbytes == index.words.nbytes and index.namespaces == 0  # only the fixed table


class _SlowEmbedder:
    name = "slow"
    dim = 384
    model_id = "slow"

    def embed(self, texts: list[str]) -> np.ndarray:
        time.sleep(0.01)
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = 1.0
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())


async def test_refused_stores_are_counted_and_refresh_waits() -> None:
    slow = AsyncEmbedder(_SlowEmbedder(), batch_max=1, queue_max=1)  # type: ignore[arg-type]
    try:
        cache = SemanticCache(_settings(), worker=slow)
        done = await asyncio.gather(*(cache.store(NS, f"question {i}", b"a") for i in range(8)))
        assert not all(done)
        assert cache.refused.get("busy", 0) == done.count(False) > 0
        assert cache.stored == done.count(True)
        waited = await asyncio.gather(
            *(cache.store(NS, f"refresh {i}", b"a", wait_s=5.0) for i in range(8))
        )
        assert all(waited) and cache.stored == done.count(True) + 8
    finally:
        slow.close()


async def test_several_workers_share_the_queue_and_memo() -> None:
    two = AsyncEmbedder([_SlowEmbedder(), _SlowEmbedder()], batch_max=1, queue_max=64)  # type: ignore[list-item]
    try:
        texts = [f"question {i}" for i in range(8)]
        t0 = time.perf_counter()
        await asyncio.gather(*(two.embed([t]) for t in texts))
        assert time.perf_counter() - t0 < 8 * 0.01  # two threads sleep in parallel
        assert two.embedded == 8 and two.memo_hits == 0
        again = await two.embed([texts[3]])
        assert two.embedded == 8 and two.memo_hits == 1 and again.shape == (1, 384)
    finally:
        two.close()


class _RecordingEmbedder(_SlowEmbedder):
    """Each model call's texts and thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append((threading.current_thread().name, list(texts)))
        return super().embed(texts)


async def test_warm_runs_beside_a_job_on_an_idle_thread_never_batched_with_it() -> None:
    rec = _RecordingEmbedder()
    two = AsyncEmbedder([rec, rec], batch_max=8, queue_max=64)  # type: ignore[list-item]
    try:
        await threads_idle(two, 2)
        done = two.warm(["clause one", "clause two"])
        assert done is not None
        await two.embed(["the question"])
        assert await asyncio.to_thread(done.wait, 5)
        # Two model calls: the warm in a batch of its own (on the other thread, unless this
        # one is done first: the scheduler's call).
        assert sorted(texts for _, texts in rec.calls) == [
            ["clause one", "clause two"],
            ["the question"],
        ]
        assert two.remembers("clause one") and two.warmed == 2
        # Nothing left to warm (remembered), or no second idle thread: nothing queued.
        await threads_idle(two, 2)
        assert two.warm(["clause one"]) is None
        stuck = asyncio.ensure_future(two.embed(["a long job"]))
        await asyncio.sleep(0)  # the job is queued or taken: one thread left
        assert two.idle() <= 1
        assert two.warm(["another clause"]) is None
        await stuck
    finally:
        two.close()
    one = AsyncEmbedder(_RecordingEmbedder(), batch_max=8, queue_max=64)  # type: ignore[arg-type]
    try:
        await threads_idle(one, 1)
        assert one.warm(["a clause"]) is None  # the caller's own job needs the only thread
    finally:
        one.close()


class _FailingEmbedder(_RecordingEmbedder):
    """Fails every model call with a text containing "bad"."""

    def embed(self, texts: list[str]) -> np.ndarray:
        if any("bad" in t for t in texts):
            raise RuntimeError("model failure")
        return super().embed(texts)


async def test_a_failed_warm_still_says_done_and_the_threads_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = _FailingEmbedder()
    two = AsyncEmbedder([rec, rec], batch_max=8, queue_max=64)  # type: ignore[list-item]
    try:
        await threads_idle(two, 2)
        done = two.warm(["bad"])
        assert done is not None and await asyncio.to_thread(done.wait, 5)
        assert not two.remembers("bad") and "embedding failed" in caplog.text
        assert (await two.embed(["good"])).shape == (1, 384)  # no thread was lost
    finally:
        two.close()


async def test_a_failure_on_the_worker_is_logged_once_and_skips_the_cache(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = AsyncEmbedder(_FailingEmbedder(), batch_max=8, queue_max=64)  # type: ignore[arg-type]

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]

    try:
        cache = SemanticCache(_settings(threshold=0.5), worker=one)
        assert await cache.store(NS, "good question", b"a")
        # The model fails: the worker logs it, with its traceback; the lookup and the store
        # that waited on it do not log it again.
        caplog.clear()
        res = await cache.lookup(NS, "bad question")
        assert (res.outcome, res.reason) == ("skipped", "error")
        assert logged() == ["embedding failed"] and caplog.records[0].exc_info is not None
        caplog.clear()
        assert not await cache.store(NS, "bad answer", b"a") and cache.refused["error"] == 1
        assert logged() == ["embedding failed"]
        # The follow-up fails (here the index search): logged once too.
        caplog.clear()

        def broken(*args: object) -> None:
            raise RuntimeError("index failure")

        monkeypatch.setattr(cache.index, "search", broken)
        res = await cache.lookup(NS, "good question")
        assert (res.outcome, res.reason) == ("skipped", "error")
        assert logged() == ["semantic cache job failed"]
    finally:
        one.close()


async def test_a_follow_up_asks_for_more_vectors_on_its_own_thread() -> None:
    rec = _RecordingEmbedder()
    two = AsyncEmbedder([rec, rec], batch_max=8, queue_max=64)  # type: ignore[list-item]
    try:
        await threads_idle(two, 2)
        ahead = two.warm(["b"])
        seen: list[tuple[str, bool, int]] = []

        def then(vectors: np.ndarray | None) -> More:
            assert vectors is not None
            seen.append((threading.current_thread().name, two._state.locked(), len(vectors)))
            return More(["b", "c"], after_more, ahead)

        def after_more(vectors: np.ndarray) -> str:
            seen.append((threading.current_thread().name, two._state.locked(), len(vectors)))
            return "done"

        assert await two.submit(["a"], then) == "done"
        # Both steps under the lock on one thread; "b" came from the warm, not embedded again.
        assert seen[0][0] == seen[1][0] and seen[0][1:] == (True, 1) and seen[1][1:] == (True, 2)
        model = sorted(t for _, texts in rec.calls for t in texts)
        assert model == ["a", "b", "c"]
    finally:
        two.close()


async def test_lookup_budget_sends_a_slow_lookup_upstream_and_keeps_its_vector() -> None:
    from gateway.cache.semantic_layer import SemanticLayer
    from gateway.cache.semantic_settings import SemanticRoute

    slow = AsyncEmbedder(_SlowEmbedder(), batch_max=1, queue_max=8)  # type: ignore[arg-type]
    try:
        settings = _settings(lookup_budget_ms=1)
        layer = SemanticLayer(settings, None, "test:")
        layer.cache = SemanticCache(layer.settings, worker=slow)
        body = {"model": "m", "messages": [{"role": "user", "content": "How do tides work?"}],
                "temperature": 0}  # fmt: skip
        plan = layer.plan("t", "m", body, SemanticRoute(enabled=True))
        assert plan is not None
        # It shares a word ("tides"): not raced from the start, the budget applies.
        await layer.cache.store(plan.namespace, "Why do tides turn?", b"turn")
        assert await layer.lookup(plan) is None and layer.late == 1 and layer.early == 0
        task = layer.store(plan, b"answer")
        assert task is not None and await task
        assert slow.embedded == 2  # the store used the late lookup's vector
    finally:
        slow.close()


async def test_lookup_in_an_empty_namespace_does_not_embed(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(_settings(), worker=worker)
    before = worker.embedded + worker.memo_hits
    res = await cache.lookup("t\x1fm\x1fnew-conversation", "A question never asked here?")
    assert res.outcome == "miss" and res.reason == "empty_namespace" and res.vector is None
    assert worker.embedded + worker.memo_hits == before
    assert await cache.store("t\x1fm\x1fnew-conversation", "A question never asked here?", b"a")
    assert (await cache.lookup("t\x1fm\x1fnew-conversation", "A question never asked here?")).hit
