"""Train the semantic cache's verifier and write gateway/cache/verifier_model.json.

    python -m loadtests.train_verifier [--trees 300] [--depth 4] [--target-false 0.03]

Data and splits: `loadtests.verifier_data` (PAWS-Wiki dev, chat_pairs.tsv, pairs derived from the
training split). The model is fit on the train split; the decision threshold is the lowest
probability whose false-hit rate on the tune split's chat pairs stays at or under
`--target-false` (and on its PAWS pairs at or under 5%). The holdout split and near_misses.tsv are
never used here. Deterministic (fixed seeds); needs scikit-learn (training only, not at run time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from gateway.cache.pair_features import FEATURES, features
from gateway.cache.verifier import MODEL_PATH
from loadtests.verifier_data import Pair, augment, load_chat, load_paws

RETRIEVAL_FLOOR = 0.60


async def embed_cosines(pairs: list[Pair], kind: str = "auto", cache: Path | None = None) -> None:
    """Cosine of each pair with the cache's own embedder (memoised in `cache` when given)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    known: dict[str, float] = {}
    if cache is not None and cache.exists():
        known = json.loads(cache.read_text(encoding="utf-8"))
    todo = [p for p in pairs if f"{p.s1}\x00{p.s2}" not in known]
    if todo:
        from gateway.cache.embedder import make_embedder

        emb = make_embedder(kind)  # type: ignore[arg-type]
        texts = list(dict.fromkeys(t for p in todo for t in (p.s1, p.s2)))
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding
        vecs = np.zeros((len(texts), emb.dim), dtype=np.float32)
        for start in range(0, len(order), 64):
            idx = order[start : start + 64]
            vecs[idx] = emb.embed([texts[i] for i in idx])
        pos = {t: i for i, t in enumerate(texts)}
        for p in todo:
            known[f"{p.s1}\x00{p.s2}"] = float(vecs[pos[p.s1]] @ vecs[pos[p.s2]])
        if cache is not None:
            cache.write_text(json.dumps(known), encoding="utf-8")
    for p in pairs:
        p.cosine = known[f"{p.s1}\x00{p.s2}"]


def matrix(pairs: list[Pair]) -> np.ndarray:
    # features(new question, cached question): s2 is asked, s1 is in the cache
    return np.array([features(p.s2, p.s1, p.cosine) for p in pairs], dtype=np.float64)


def export(model, threshold: float, meta: dict) -> dict:  # type: ignore[no-untyped-def]
    trees = []
    for est in model.estimators_[:, 0]:
        t = est.tree_
        trees.append(
            {
                "feature": [int(f) for f in t.feature],
                "threshold": [float(round(x, 6)) for x in t.threshold],
                "left": [int(c) for c in t.children_left],
                "right": [int(c) for c in t.children_right],
                "value": [float(round(v, 6)) for v in t.value[:, 0, 0]],
            }
        )
    prior = model.init_.class_prior_[1]
    return {
        "kind": "gradient_boosted_trees",
        "features": list(FEATURES),
        "init": float(np.log(prior / (1 - prior))),
        "learning_rate": float(model.learning_rate),
        "depth": int(model.max_depth),
        "threshold": threshold,
        "retrieval_floor": RETRIEVAL_FLOOR,
        "trees": trees,
        "meta": meta,
    }


def false_rate(p: np.ndarray, y: np.ndarray, t: float) -> float:
    neg = y == 0
    return float((p[neg] >= t).mean()) if neg.any() else 0.0


def hit_rate(p: np.ndarray, y: np.ndarray, t: float) -> float:
    pos = y == 1
    return float((p[pos] >= t).mean()) if pos.any() else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--rate", type=float, default=0.1)
    ap.add_argument("--target-false", type=float, default=0.03)
    ap.add_argument("--out", default=str(MODEL_PATH))
    ap.add_argument("--cosine-cache", default="", help="JSON file memoising pair cosines")
    args = ap.parse_args()
    from sklearn.ensemble import GradientBoostingClassifier

    t0 = time.perf_counter()
    base = load_paws() + load_chat()
    train = [p for p in base if p.split == "train"]
    derived = augment(train)
    pairs = base + derived
    asyncio.run(embed_cosines(pairs, cache=Path(args.cosine_cache) if args.cosine_cache else None))
    pairs = [p for p in pairs if p.cosine >= RETRIEVAL_FLOOR]
    train = [p for p in pairs if p.split == "train"]
    tune = [p for p in pairs if p.split == "tune"]
    x, y = matrix(train), np.array([p.label for p in train])
    # PAWS (long wiki sentences) would outweigh the chat questions 10 to 1: equal total weight.
    paws = np.array([p.source == "paws" for p in train])
    w = np.where(paws, (~paws).sum() / max(paws.sum(), 1), 1.0)
    model = GradientBoostingClassifier(
        n_estimators=args.trees,
        max_depth=args.depth,
        learning_rate=args.rate,
        subsample=0.8,
        random_state=0,
    )
    model.fit(x, y, sample_weight=w)
    pt = model.predict_proba(matrix(tune))[:, 1]
    yt = np.array([p.label for p in tune])
    chat_t = np.array([p.source == "chat" for p in tune])
    paws_t = ~chat_t
    threshold = 0.99
    for t in np.round(np.arange(0.99, 0.05, -0.01), 2):
        if (
            false_rate(pt[chat_t], yt[chat_t], t) <= args.target_false
            and false_rate(pt[paws_t], yt[paws_t], t) <= 0.05
        ):
            threshold = float(t)
        else:
            break
    for t in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95):
        print(
            f"tune t={t}: chat hit {hit_rate(pt[chat_t], yt[chat_t], t):.3f} "
            f"false {false_rate(pt[chat_t], yt[chat_t], t):.3f} | paws hit "
            f"{hit_rate(pt[paws_t], yt[paws_t], t):.3f} false {false_rate(pt[paws_t], yt[paws_t], t):.3f}"
        )
    meta = {
        "data": "PAWS-Wiki dev + loadtests/data/chat_pairs.tsv + derived pairs (train split)",
        "pairs": {"train": len(train), "tune": len(tune)},
        "trees": args.trees,
        "depth": args.depth,
        "target_false_chat_tune": args.target_false,
        "tune_chat": {
            "hit": hit_rate(pt[chat_t], yt[chat_t], threshold),
            "false": false_rate(pt[chat_t], yt[chat_t], threshold),
        },
        "tune_paws": {
            "hit": hit_rate(pt[paws_t], yt[paws_t], threshold),
            "false": false_rate(pt[paws_t], yt[paws_t], threshold),
        },
    }
    out = export(model, threshold, meta)
    Path(args.out).write_text(json.dumps(out, separators=(",", ":")) + "\n", encoding="utf-8")
    imp = sorted(zip(model.feature_importances_, FEATURES, strict=True), reverse=True)
    print(json.dumps(meta, indent=2))
    print("threshold", threshold, "importances", [(f, round(v, 3)) for v, f in imp[:12]])
    print(f"done in {time.perf_counter() - t0:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
