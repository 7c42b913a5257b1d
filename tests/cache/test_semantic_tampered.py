"""Semantic cache records that come back from Redis are checked before they enter the index.

Redis is written by other processes: a record that is not what a gateway writes (a vector that
is not finite or not of unit length, fields of other types, pickle bytes, a key that is not UTF-8) is never loaded, is counted in
`stats()["invalid"]`, and neither stops a rebuild nor the subscription. A vector scaled by 1000
scored 1000 against an unrelated question, and its answer was served.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import numpy as np
import orjson
import pytest
from redis.asyncio import Redis

pytest.importorskip("faiss")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.cache.async_embedder import AsyncEmbedder  # noqa: E402
from gateway.cache.embedder import make_embedder  # noqa: E402
from gateway.cache.semantic import SemanticCache  # noqa: E402
from gateway.cache.semantic_index import Entry  # noqa: E402
from gateway.cache.semantic_settings import SemanticSettings  # noqa: E402
from gateway.cache.semantic_store import encode_entry, entry_id_for  # noqa: E402
from tests.conftest import REDIS_URL  # noqa: E402  (this worker's database)

NS = "t1\x1fchat\x1fctx"
ASKED = "How do I bake sourdough bread?"
OTHER = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"


@pytest.fixture(scope="module")
def worker() -> Iterator[AsyncEmbedder]:
    w = AsyncEmbedder(make_embedder("auto"), batch_max=32, queue_max=256)
    yield w
    w.close()


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    r = Redis.from_url(REDIS_URL)
    try:
        await r.ping()
    except Exception:
        pytest.skip(f"Redis not running at {REDIS_URL}")
    yield r
    keys = [k async for k in r.scan_iter(match="test:semtamper:*", count=1000)]
    if keys:
        await r.delete(*keys)
    await r.aclose()


def _settings() -> SemanticSettings:
    prefix = f"test:semtamper:{uuid.uuid4().hex[:8]}:"
    return SemanticSettings.model_validate({"redis_prefix": prefix, "redis_channel": prefix + "ch"})


def _record(vector: np.ndarray, ns: str, text: str, model_id: str) -> tuple[str, bytes]:
    entry_id = entry_id_for(ns, text)
    entry = Entry(entry_id, ns, text, vector.astype(np.float32), b"cached", time.time() + 300)
    return entry_id, encode_entry(entry, model_id, "elsewhere")


def _with_header(blob: bytes, **changes: object) -> bytes:
    """The record with header fields changed (vector and response kept)."""
    hlen = struct.unpack_from("<3sI", blob)[1]
    header = orjson.loads(blob[7 : 7 + hlen])
    header.update(changes)
    new = orjson.dumps(header)
    return struct.pack("<3sI", b"GS1", len(new)) + new + blob[7 + hlen :]


async def _tampered(worker: AsyncEmbedder, model_id: str) -> dict[str, tuple[str, bytes]]:
    """Records that must not load, by what is wrong with them, each under its own id and in its
    own namespace, with the vector of the question asked later (or near it): loading one would
    serve its answer to that question."""
    v = (await worker.embed([ASKED]))[0]
    first = np.arange(v.size) == 0
    out: dict[str, tuple[str, bytes]] = {}
    for name, vec in {
        "scaled": v * 1000,
        "slightly_long": v * 1.2,
        "short": v * 0.5,
        "inf": np.where(first, np.inf, v),
        "nan": np.where(first, np.nan, v),
        "zero": np.zeros_like(v),
    }.items():
        out[name] = _record(vec, NS + name, OTHER, model_id)
    for name, changes in {
        "exp_string": {"exp": "never"},
        "exp_bool": {"exp": True},
        "ns_number": {"ns": 12},
        "text_list": {"t": ["a"]},
        "dim_negative": {"d": -4},
        "dim_beyond": {"d": 10**6},
        "dim_short": {"d": 16},
        "no_model": {"m": None},
    }.items():
        entry_id, good = _record(v, NS + name, OTHER, model_id)
        out[name] = (entry_id, _with_header(good, **changes))
    entry_id, good = _record(v, NS + "header_list", OTHER, model_id)
    out["header_list"] = (entry_id, struct.pack("<3sI", b"GS1", 2) + b"[]" + good[7:])
    out["pickle"] = (
        entry_id_for(NS + "pickle", OTHER),
        pickle.dumps({"ns": NS, "t": OTHER, "response": b"cached"}),
    )
    out["short_blob"] = (entry_id_for(NS + "short_blob", OTHER), b"GS")
    return out


async def test_tampered_records_are_not_loaded_and_are_counted(
    worker: AsyncEmbedder, redis: Redis
) -> None:
    settings = _settings()
    model_id = worker.embedder.model_id
    bad = await _tampered(worker, model_id)
    for entry_id, blob in bad.values():
        await redis.set(settings.redis_prefix + entry_id, blob, ex=300)
    await redis.set(settings.redis_prefix.encode() + b"\xff\xfe", bad["scaled"][1], ex=300)
    v = (await worker.embed([OTHER]))[0]
    good_id, good = _record(v, NS, OTHER, model_id)
    await redis.set(settings.redis_prefix + good_id, good, ex=300)
    # Another embedding model's entry is skipped, not counted as damaged.
    other_id, other_model = _record(v, NS + "m", OTHER, "another-model")
    await redis.set(settings.redis_prefix + other_id, other_model, ex=300)

    cache = SemanticCache(settings, redis=redis, worker=worker)
    await cache.start()
    try:
        assert len(cache.index) == 1  # the gateway's own record only
        assert cache.stats()["invalid"] == len(bad) + 1
        assert cache.stats()["other_model"] == 1
        for name in bad:
            found = await cache.lookup(NS + name, ASKED)
            assert found.outcome == "miss" and found.hit is None, name
        hit = await cache.lookup(NS, PARAPHRASE)
        assert hit.outcome == "hit" and hit.hit is not None and hit.hit.response == b"cached"
        # The rebuild went through: Redis is not marked down by a damaged record.
        assert cache.store_backend is not None and cache.store_backend.available()
        assert cache.stats()["redis_errors"] == 0
    finally:
        await cache.aclose()


async def test_tampered_messages_do_not_enter_or_stop_the_subscription(
    worker: AsyncEmbedder, redis: Redis
) -> None:
    settings = _settings()
    cache = SemanticCache(settings, redis=redis, worker=worker)
    await cache.start()
    publisher = Redis.from_url(REDIS_URL)
    model_id = worker.embedder.model_id
    try:
        bad = await _tampered(worker, model_id)
        for entry_id, blob in bad.values():
            await publisher.publish(settings.redis_channel, entry_id.encode() + b"\n" + blob)
        await publisher.publish(settings.redis_channel, b"\xff\xfe\n" + bad["scaled"][1])
        good_id, good = _record((await worker.embed([OTHER]))[0], NS, OTHER, model_id)
        await publisher.publish(settings.redis_channel, good_id.encode() + b"\n" + good)
        for _ in range(250):
            if len(cache.index) == 1:
                break
            await asyncio.sleep(0.02)
        assert len(cache.index) == 1
        assert cache.stats()["invalid"] == len(bad) + 1
        for name in bad:
            assert (await cache.lookup(NS + name, ASKED)).outcome == "miss", name
        assert (await cache.lookup(NS, PARAPHRASE)).outcome == "hit"
    finally:
        await publisher.aclose()
        await cache.aclose()
