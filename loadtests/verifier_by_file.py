"""Verifier models side by side on the written holdout and unseen/, by the file of each pair.

Shows whether a model's hit rate holds on domains it was not trained on: group the written files
(`--group NAME=stem,stem`; files in no group form "other files") and score each model at its own
threshold on each group's holdout pairs (hits on paraphrases / false hits on the rest).

    python -m loadtests.verifier_by_file --cosine-cache /tmp/cos.json \\
        --model previous=OLD.json --model new=gateway/cache/verifier_model.json \\
        --group "8 new files=sports,education,vehicles,housing,animals,science,arts,health"
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import numpy as np

from gateway.cache.verifier import MODEL_PATH, Verifier
from loadtests.train_verifier import embed_cosines
from loadtests.verifier_data import Pair, load_unseen, load_written


def rates(v: Verifier, pairs: list[Pair]) -> tuple[float, float]:
    """(hit rate on label 1, false-hit rate on label 0) at the model's own threshold."""
    y = np.array([p.label for p in pairs])
    served = np.array(
        [p.cosine >= v.retrieval_floor and v.probability(p.s2, p.s1, p.cosine) >= v.threshold
         for p in pairs]
    )  # fmt: skip
    hit = float(served[y == 1].mean()) if (y == 1).any() else 0.0
    false = float(served[y == 0].mean()) if (y == 0).any() else 0.0
    return hit, false


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument("--group", action="append", default=[], help="NAME=stem,stem (repeatable)")
    ap.add_argument("--cosine-cache", default="", help="JSON file memoising pair cosines")
    args = ap.parse_args()
    models = dict(m.split("=", 1) for m in args.model) or {"shipped": str(MODEL_PATH)}
    groups = {
        name: {s if s.startswith("pairs_") else f"pairs_{s}" for s in stems.split(",")}
        for name, stems in (g.split("=", 1) for g in args.group)
    }
    pairs = [p for p in load_written() if p.split == "holdout"] + load_unseen()
    cache = Path(args.cosine_cache) if args.cosine_cache else None
    asyncio.run(embed_cosines(pairs, cache=cache))

    def group_of(p: Pair) -> str:
        if p.source == "unseen":
            return "unseen/ (every pair)"
        return next(
            (n for n, stems in groups.items() if Path(p.origin).stem in stems), "other files"
        )

    verifiers = {
        n: Verifier(json.loads(Path(path).read_text(encoding="utf-8")))
        for n, path in models.items()
    }
    print("| written holdout | pairs: same / other | " + " | ".join(verifiers) + " |")
    print("|---|---|" + "---|" * len(verifiers))
    for name in ["other files", *groups, "unseen/ (every pair)"]:
        sel = [p for p in pairs if group_of(p) == name]
        if not sel:
            continue
        same = sum(p.label for p in sel)
        cells = [f"{h:.1%} / {f:.1%}" for h, f in (rates(v, sel) for v in verifiers.values())]
        print(f"| {name} | {same} / {len(sel) - same} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
