"""What `semantic_cache.verifier_threshold` trades, on the verifier's tune split.

    python -m loadtests.verifier_thresholds [--cosine-cache /tmp/cos.json] [--thresholds 0.6,0.72,0.8]

For each threshold, with the shipped model (`gateway/cache/verifier_model.json`) as the gateway
runs it (identical texts served, the near-miss rules applied): the tune split's chat pairs in one
shared cache (paraphrases served right, other questions sharing most words served: "near
misses"), and its PAWS pairs alone (hits / false hits). The tune split is never trained on; it
chose the model's own threshold (`loadtests/train_verifier.py`). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np

from gateway.cache.verifier import default_verifier
from loadtests.train_verifier import (
    RETRIEVAL_FLOOR,
    SharedTune,
    embed_cosines,
    embed_texts,
    false_rate,
    hit_rate,
    model_probability,
)
from loadtests.verifier_data import load_chat, load_paws, load_written


class Shipped:
    """The shipped model behind the trainer's `predict_proba` interface."""

    def __init__(self) -> None:
        self.verifier = default_verifier()

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        p = np.array([self.verifier.probability_of(list(row)) for row in x])
        return np.stack([1 - p, p], axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cosine-cache", default="", help="JSON file memoising pair cosines")
    ap.add_argument(
        "--thresholds", default="", help="comma-separated; default: 0.6-0.9 and the model's own"
    )
    args = ap.parse_args()
    tune = [p for p in load_paws() + load_chat() + load_written() if p.split == "tune"]
    chat = [p for p in tune if p.source != "paws"]
    paws = [p for p in tune if p.source == "paws"]
    cache = Path(args.cosine_cache) if args.cosine_cache else None
    asyncio.run(embed_cosines(paws, cache=cache))
    paws = [p for p in paws if p.cosine >= RETRIEVAL_FLOOR]  # below it: never a candidate
    shipped = Shipped()
    prob = model_probability(shipped)
    shared = SharedTune(chat, embed_texts([t for p in chat for t in (p.s1, p.s2)]))
    pp = np.array([prob(p.s2, p.s1, p.cosine) for p in paws])
    yp = np.array([p.label for p in paws])
    print("| `verifier_threshold` | paraphrases served | near misses served | PAWS: hits / false |")
    print("|---|---|---|---|")
    own = shipped.verifier.threshold
    wanted = args.thresholds.split(",") if args.thresholds else [0.6, 0.66, own, 0.8, 0.85, 0.9]
    for t in sorted({round(float(x), 2) for x in wanted}):
        r = shared.at(t, pt_of=prob)
        name = f"{t:.2f} (the model's own, the default)" if t == round(own, 2) else f"{t:.2f}"
        print(
            f"| {name} | {r['right']:.1%} | {r['near_misses_served']:.1%} | "
            f"{hit_rate(pp, yp, t):.1%} / {false_rate(pp, yp, t):.1%} |"
        )


if __name__ == "__main__":
    main()
