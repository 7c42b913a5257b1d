"""Groups of shared context: a long question whose context a cached one shares word for word is
judged by its own clause, without embedding the whole text, and gets the verdict the whole-text
search gives. Real model, real FAISS, real Redis for the replica case."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis

pytest.importorskip("faiss")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.cache.async_embedder import AsyncEmbedder  # noqa: E402
from gateway.cache.context_index import context_keys  # noqa: E402
from gateway.cache.embedder import make_embedder  # noqa: E402
from gateway.cache.semantic import SemanticCache  # noqa: E402
from gateway.cache.semantic_index import Entry, SemanticIndex  # noqa: E402
from gateway.cache.semantic_settings import SemanticSettings  # noqa: E402
from gateway.cache.shared_context import clauses  # noqa: E402
from tests.conftest import REDIS_URL  # noqa: E402

CONTEXT = (
    "My team maintains a Django app with a Postgres database and about forty models. "
    "We deploy it twice a week with a small CI pipeline."
)
TAIL = " I tried the settings menu and the official help pages but nothing worked so far."
STORED = [
    f"{CONTEXT} How do we speed up the test suite?",
    f"{CONTEXT} How do we shorten the build?",
    "How do I reset my photos on my iPhone safely?" + TAIL,
    "How do I back up my photos on my iPhone safely?" + TAIL,
    "Does the router support WPA3?" + TAIL,
]
ASKED = [
    f"{CONTEXT} How can we make the test suite faster?",  # a rewording after the context
    f"{CONTEXT} Which hosting provider is cheapest?",  # another question after it
    f"{CONTEXT} How do we speed up the test suite? Thanks!",  # one clause more: no group
    "How can I back up my photos on my iPhone safely?" + TAIL,  # a rewording before it
    "How can I sync my photos on my iPhone safely?" + TAIL,  # another question before it
    "Is WPA3 supported by the router?" + TAIL,
    "Does the router support WPA2?" + TAIL,
    STORED[2],  # verbatim
    "How do I reset my photos on my iPhone safely? I tried the settings menu.",  # other context
]


@pytest.fixture(scope="module")
def worker() -> Iterator[AsyncEmbedder]:
    w = AsyncEmbedder(make_embedder("auto"), batch_max=8, queue_max=256)
    yield w
    w.close()


def watch_model(cache: SemanticCache) -> list[str]:
    """The texts the model embeds from now on (memo hits left out; the memo is emptied first:
    the module's worker is shared)."""
    cache.worker._memo.clear()
    seen: list[str] = []
    embed = cache.worker._embed

    def watched(texts: list[str], embedder: Any, lone: bool = True) -> np.ndarray:
        seen.extend(t for t in texts if not cache.worker.remembers(t))
        return embed(texts, embedder, lone)

    cache.worker._embed = watched  # type: ignore[method-assign]
    return seen


async def verdicts(worker: AsyncEmbedder, groups: bool) -> tuple[list[tuple[str, Any]], int]:
    cache = SemanticCache(SemanticSettings(vector_memo=0, context_groups=groups), worker=worker)
    await cache.start()
    try:
        for text in STORED:
            assert await cache.store("ns", text, text.encode(), wait_s=5)
        out = []
        for text in ASKED:
            found = await cache.lookup("ns", text)
            out.append((found.outcome, found.hit.question if found.hit else None))
        return out, cache.context_hits
    finally:
        await cache.aclose()


async def test_the_verdicts_are_those_of_the_whole_text_search(worker: AsyncEmbedder) -> None:
    with_groups, by_context = await verdicts(worker, True)
    without, none = await verdicts(worker, False)
    assert with_groups == without
    outcomes = [o for o, _ in with_groups]
    # Another question after the context: its clause's cosine to the stored ones sits at the
    # retrieval floor, below it (a miss) or just above (refused) by the CPU's int8 kernels
    # (with or without VNNI: both seen).
    assert outcomes[1] in ("miss", "rejected")
    assert outcomes[:1] + outcomes[2:] == [
        "hit", "rejected", "hit", "rejected", "hit", "rejected", "hit", "rejected",
    ]  # fmt: skip
    assert with_groups[0][1] == STORED[0] and with_groups[3][1] == STORED[3]
    # the three rewordings found by their context; the verbatim one by its id
    assert by_context == 3 and none == 0


async def test_a_rewording_embeds_its_clause_alone(worker: AsyncEmbedder) -> None:
    cache = SemanticCache(SemanticSettings(vector_memo=64), worker=worker)
    await cache.start()
    try:
        for text in STORED:
            assert await cache.store("ns", text, text.encode(), wait_s=5)
        model = watch_model(cache)
        found = await cache.lookup("ns", ASKED[3])
        assert found.outcome == "hit" and found.hit is not None
        # its own clause, never the whole text; the members' clauses are in their group
        assert model == ["How can I back up my photos on my iPhone safely?"]
        assert found.vector is None and cache.context_hits == 1
        # The similarity a hit reports is that of the clauses judged.
        assert 0.6 < found.hit.similarity < 0.999
        # Another question after the same context: the whole text's search follows, its
        # clause from the memo (embedded once), and its vector is there for the store.
        model.clear()
        other = await cache.lookup("ns", ASKED[4])
        assert other.outcome == "rejected" and other.vector is not None
        assert model.count("How can I sync my photos on my iPhone safely?") == 1
        assert model.count(ASKED[4]) == 1
    finally:
        await cache.aclose()


async def test_a_threshold_of_the_policy_keeps_the_whole_text_search(
    worker: AsyncEmbedder,
) -> None:
    """A threshold bounds the whole texts' cosine: only their search can apply it."""
    for settings, threshold in ((SemanticSettings(threshold=0.7), None), (SemanticSettings(), 0.7)):
        cache = SemanticCache(settings, worker=worker)
        await cache.start()
        try:
            for text in STORED:
                assert await cache.store("ns", text, text.encode(), wait_s=5)
            model = watch_model(cache)
            found = await cache.lookup("ns", ASKED[3], threshold=threshold)
            assert found.outcome == "hit" and cache.context_hits == 0
            assert ASKED[3] in model
        finally:
            await cache.aclose()


async def test_groups_are_per_namespace_and_leave_with_their_entries(
    worker: AsyncEmbedder,
) -> None:
    cache = SemanticCache(SemanticSettings(ttl_s=60), worker=worker)
    await cache.start()
    try:
        base = cache.index.nbytes
        for text in STORED:
            assert await cache.store("a", text, b"x", wait_s=5)
        assert cache.index.contexts.has_namespace("a")
        assert not cache.index.contexts.has_namespace("b")
        # every text in two groups (its first clause's, its last's) but where the rest is under
        # six words: "Does the router support WPA3?" is no context for the last clause
        assert len(cache.index.contexts) == 2 * len(STORED) - 1
        assert cache.index.nbytes - base > cache.index.contexts.nbytes > 0
        # the same rewording in another namespace finds nothing of "a"
        assert await cache.store("b", "An unrelated short question?", b"y", wait_s=5)
        assert (await cache.lookup("b", ASKED[3])).outcome != "hit"
        for text in STORED:
            assert await cache.discard(cache_id("a", text))
        assert await cache.discard(cache_id("b", "An unrelated short question?"))
        assert len(cache.index.contexts) == 0 and cache.index.contexts.nbytes == 0
        assert not cache.index.contexts.has_namespace("a")
        assert cache.index.nbytes == base
    finally:
        await cache.aclose()


def cache_id(namespace: str, text: str) -> str:
    from gateway.cache.semantic_store import entry_id_for

    return entry_id_for(namespace, text)


def test_every_byte_of_the_groups_is_counted_under_churn() -> None:
    """Random vectors, texts of several clauses sharing contexts, evictions by size and TTL:
    the index's count is its entries' and groups' sum at every step, and stays in bounds."""
    dim = 8
    rng = np.random.default_rng(5)
    index = SemanticIndex(dim, max_entries=10_000, max_bytes=400_000)

    def unit() -> np.ndarray:
        v = rng.standard_normal(dim).astype(np.float32)
        return v / np.linalg.norm(v)

    for i in range(3000):
        ns = f"ns{i % 7}"
        text = f"Question number {i % 50} here? {TAIL} Context {i % 3} of the pages."
        parts = clauses(text)
        joined = [(key, unit()) for _, key in context_keys(ns, parts)]
        entry = Entry(f"id{i % 900}", ns, text, unit(), b"r" * 200, float(i % 40 + 10))
        if index.add(entry, now=float(i % 40)):
            index.join({entry.entry_id: joined})
        assert index.nbytes <= index.max_bytes
    recount = index.words.nbytes + index.contexts.nbytes
    recount += sum(e.nbytes for e in index._entries.values())
    recount += sum(s.nbytes for s in index._spaces.values())
    assert index.nbytes == recount
    for entry_id in list(index._entries):
        index.remove(entry_id)
    assert index.contexts.nbytes == 0 and len(index.contexts) == 0
    assert index.nbytes == index.words.nbytes


async def test_another_namespaces_entry_under_the_same_key_is_never_judged(
    worker: AsyncEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group key is a hash: one shared by two namespaces (forced here) serves nothing across."""
    import gateway.cache.semantic as semantic

    monkeypatch.setattr(
        semantic, "context_keys", lambda _ns, parts: [(0, 42), (len(parts) - 1, 43)]
    )
    cache = SemanticCache(SemanticSettings(), worker=worker)
    await cache.start()
    try:
        assert await cache.store("a", STORED[3], b"a's answer", wait_s=5)
        assert await cache.store("b", STORED[4], b"b's answer", wait_s=5)
        found = await cache.lookup("b", ASKED[3])
        assert found.outcome != "hit" and cache.context_hits == 0
    finally:
        await cache.aclose()


async def test_a_replicas_entries_join_no_group_and_are_still_served(
    worker: AsyncEmbedder,
) -> None:
    redis = Redis.from_url(REDIS_URL)
    try:
        await redis.ping()
    except Exception:
        pytest.skip(f"Redis not running at {REDIS_URL}")
    prefix = f"test:sem:{uuid.uuid4().hex[:8]}:"
    settings = SemanticSettings(redis_prefix=prefix, redis_channel=prefix + "chan")
    first = SemanticCache(settings, redis=redis, worker=worker)
    await first.start()
    assert await first.store("ns", STORED[3], b"stored", wait_s=5)
    await first.flush()
    await first.aclose()
    second = SemanticCache(settings, redis=redis, worker=worker)
    await second.start()
    try:
        assert len(second.index) == 1 and len(second.index.contexts) == 0
        found = await second.lookup("ns", ASKED[3])
        assert found.outcome == "hit" and found.hit is not None
        assert found.hit.response == b"stored" and second.context_hits == 0
    finally:
        await second.aclose()
        keys = [k async for k in redis.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def test_a_group_key_names_the_shared_clauses() -> None:
    parts = clauses(STORED[3])
    assert len(parts) == 2
    keys = context_keys("ns", parts)
    assert [i for i, _ in keys] == [0, 1]
    other = context_keys("ns", clauses(ASKED[3]))
    assert keys[0][1] == other[0][1]  # the same tail: one group for the first clause
    assert keys[1][1] != other[1][1]
    assert context_keys("other", parts)[0][1] != keys[0][1]
    # a context of too few words never dominates: no group for it
    assert [i for i, _ in context_keys("ns", ["Hi there.", "How do I reset my photos?"])] == [0]


async def test_a_namespaces_first_entry_joins_its_groups_with_the_second(
    worker: AsyncEmbedder,
) -> None:
    """Most namespaces (a conversation each) hold one entry: it keeps no clause vectors, and
    costs what it costs without groups; a second entry brings both into their groups."""
    sizes = {}
    for groups in (True, False):
        cache = SemanticCache(SemanticSettings(context_groups=groups), worker=worker)
        await cache.start()
        try:
            base = cache.index.nbytes
            for i in range(3):
                assert await cache.store(f"conversation {i}", STORED[3], b"x", wait_s=5)
            sizes[groups] = cache.index.nbytes - base
            assert len(cache.index.contexts) == 0
            if groups:
                assert await cache.store("conversation 0", STORED[2], b"y", wait_s=5)
                assert len(cache.index.contexts) == 4  # both, first clause and last
                assert cache.index.contexts.has_namespace("conversation 0")
                assert not cache.index.contexts.has_namespace("conversation 1")
                model = watch_model(cache)
                found = await cache.lookup("conversation 0", ASKED[3])
                assert found.outcome == "hit" and cache.context_hits == 1
                assert ASKED[3] not in model
        finally:
            await cache.aclose()
    assert sizes[True] == sizes[False]


async def test_stores_at_once_into_a_new_namespace_all_join(worker: AsyncEmbedder) -> None:
    """Who joins is decided under the index lock, store by store: sixteen stores at once into a
    new namespace leave none of its entries out of its groups."""
    cache = SemanticCache(SemanticSettings(), worker=worker)
    await cache.start()
    try:
        texts = [f"How do I back up photo album {i} on my iPhone safely?{TAIL}" for i in range(16)]
        done = await asyncio.gather(*(cache.store("ns", t, b"x", wait_s=5) for t in texts))
        assert all(done) and len(cache.index) == 16
        assert len(cache.index.contexts) == 32  # each: its first clause's group and its last's
    finally:
        await cache.aclose()
