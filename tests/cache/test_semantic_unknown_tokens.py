"""Texts the embedding model cannot read do not match other texts by their vector.

Every part of a text the model's vocabulary has no piece for (most emoji, Thai, Georgian,
Khmer, rare CJK characters, a word over 100 characters) is one [UNK] token to the model: "What
does 😀 mean?" and "What does 😭 mean?", or two unrelated Thai questions, got the same vector
(cosine 1.0) and were served each other's answers. A candidate must now have the same
unreadable parts as the question, in order; otherwise the lookup is rejected (`unknown_tokens`).
The real embedding model and the real verifier, both embedders.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("faiss")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.cache.async_embedder import AsyncEmbedder  # noqa: E402
from gateway.cache.embedder import make_embedder, onnx_available  # noqa: E402
from gateway.cache.semantic import SemanticCache  # noqa: E402
from gateway.cache.semantic_settings import SemanticSettings  # noqa: E402

KINDS = ["onnx", "torch"] if onnx_available() else ["torch"]

DIFFERENT = [
    ("What does 😀 mean?", "What does 😭 mean?"),
    ("How do I say ประเทศไทย in English?", "How do I say ขอบคุณ in English?"),
    (
        "ประเทศไทยมีจังหวัดทั้งหมดกี่จังหวัดและจังหวัดไหนมีประชากรมากที่สุด",
        "วิธีทำต้มยำกุ้งน้ำข้นให้อร่อยเหมือนร้านอาหารชื่อดังในกรุงเทพมหานคร",
    ),
    ("ประเทศไทยมีกี่จังหวัด", "วิธีทำต้มยำกุ้ง"),
    ("鬱 是什么意思？", "鬯 是什么意思？"),
    ("Translate ქართული to English", "Translate ខ្មែរ to English"),
    ("Define " + "a" * 101, "Define " + "b" * 120),
    ("What does 😀 mean?", "What does mean?"),
]


@pytest.fixture(scope="module", params=KINDS)
def worker(request: pytest.FixtureRequest) -> Iterator[AsyncEmbedder]:
    w = AsyncEmbedder(make_embedder(request.param), batch_max=8, queue_max=64)
    yield w
    w.close()


def _cache(worker: AsyncEmbedder) -> SemanticCache:
    return SemanticCache(SemanticSettings(redis_prefix=f"t:{uuid.uuid4().hex[:6]}:"), worker=worker)


@pytest.mark.parametrize(("cached", "asked"), DIFFERENT)
async def test_texts_differing_in_unreadable_parts_do_not_match(
    worker: AsyncEmbedder, cached: str, asked: str
) -> None:
    cache = _cache(worker)
    assert await cache.store("ns", cached, b"cached answer")
    found = await cache.lookup("ns", asked)
    assert found.outcome != "hit", (cached, asked, found.similarity)
    await cache.aclose()


async def test_the_same_unreadable_parts_still_match(worker: AsyncEmbedder) -> None:
    cache = _cache(worker)
    for text in ("What does 😀 mean?", "How do I say ขอบคุณ in English?", "鬱 是什么意思？"):
        assert await cache.store("ns", text, text.encode())
        found = await cache.lookup("ns", text)
        assert found.outcome == "hit" and found.hit is not None
        assert found.hit.response == text.encode()
    found = await cache.lookup("ns", "How can I say ขอบคุณ in English?")
    assert found.outcome == "hit" and found.hit is not None
    assert found.hit.response == "How do I say ขอบคุณ in English?".encode()
    # Readable texts are unaffected.
    assert await cache.store("ns2", "What is the capital of Peru?", b"Lima")
    found = await cache.lookup("ns2", "What's the capital of Peru?")
    assert found.outcome == "hit"
    await cache.aclose()


async def test_a_rejection_is_counted_as_unknown_tokens(worker: AsyncEmbedder) -> None:
    cache = _cache(worker)
    assert await cache.store("ns", "What does 😀 mean?", b"a")
    found = await cache.lookup("ns", "What does 😭 mean?")
    assert found.outcome == "rejected" and found.reason == "unknown_tokens"
    await cache.aclose()
