"""The embedder's model variants side by side, in-process: time per text and how far apart their
vectors are.

    python -m loadtests.embedder_variants [--pairs 1000] [--rounds 3] [--calls 150]

Variants: the packaged model (fp32 MatMuls), its int8 build as the gateway runs it (ONNX Runtime
without the fusions in `embedder.UNFUSED`), and the int8 build with every fusion (as before
they were left out).

1. Time: one model call per text, one thread, a short question (~12 tokens) and a long one (~30);
   the variants take turns within each round; p50 per round.
2. Vectors: over the first `--pairs` PAWS dev pairs (both texts embedded by every variant), the
   mean and least cosine between two variants' vectors of one text, and how far each pair's
   cosine moves from one variant to another (mean and largest): what a cache deciding on pair
   cosines sees change.

Only this process; stops by itself.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np

from gateway.cache.embedder import UNFUSED, OnnxEmbedder, _session
from loadtests.verifier_data import load_paws

SHORT = "How do I reset my router password quickly?"
LONG = (
    "My sourdough starter stopped rising after I moved it to the fridge last week; should I "
    "feed it twice a day at room temperature?"
)


def variants() -> dict[str, OnnxEmbedder]:
    shipped = OnnxEmbedder()
    fused = copy.copy(shipped)
    fused._session = _session(shipped._path, 1, shipped._weights, unfused=())
    return {
        "packaged (fp32)": OnnxEmbedder(quantized=False),
        "int8, shipped": shipped,
        "int8, all fusions": fused,
    }


def timing(models: dict[str, OnnxEmbedder], rounds: int, calls: int) -> None:
    print("| text | tokens | " + " | ".join(f"{k} p50 ms" for k in models) + " |")
    print("|---|---|" + "---|" * len(models))
    for label, text in (("short", SHORT), ("long", LONG)):
        tokens = next(iter(models.values())).count_tokens(text)
        per: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(rounds):
            for name, m in models.items():
                for _ in range(10):
                    m.embed([text])
                ts = []
                for _ in range(calls):
                    t = time.perf_counter()
                    m.embed([text])
                    ts.append(time.perf_counter() - t)
                per[name].append(1e3 * statistics.median(ts))
        cells = " | ".join(", ".join(f"{x:.2f}" for x in per[k]) for k in models)
        print(f"| {label} | {tokens} | {cells} |")


def drift(models: dict[str, OnnxEmbedder], n: int) -> None:
    pairs = load_paws()[:n]
    first = [p.s1 for p in pairs]
    second = [p.s2 for p in pairs]
    vec = {k: (m.embed(first), m.embed(second)) for k, m in models.items()}
    pair_cos = {k: (a * b).sum(axis=1) for k, (a, b) in vec.items()}
    names = list(models)
    print(f"\nOver {len(pairs)} PAWS dev pairs:\n")
    print(
        "| variants | a text's two vectors: mean / least cosine | a pair's cosine moves: mean / most |"
    )
    print("|---|---|---|")
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            same = np.concatenate([(vec[x][0] * vec[y][0]).sum(1), (vec[x][1] * vec[y][1]).sum(1)])
            moved = np.abs(pair_cos[x] - pair_cos[y])
            print(
                f"| {x} / {y} | {same.mean():.5f} / {same.min():.5f} "
                f"| {moved.mean():.5f} / {moved.max():.5f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=150, help="timed calls per variant and round")
    args = ap.parse_args()
    models = variants()
    print(f"int8, shipped: without {', '.join(UNFUSED)}\n")
    timing(models, args.rounds, args.calls)
    drift(models, args.pairs)


if __name__ == "__main__":
    main()
