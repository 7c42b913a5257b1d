"""The verifier: decides whether a retrieved candidate asks the same question as the new one.

Retrieval by embedding finds candidates whose cosine reaches `retrieval_floor`; this pair
classifier then scores each (new question, cached question) pair from `pair_features` and
serves the best candidate whose probability reaches the decision threshold; the near-miss rules
(`near_miss_rules.near_miss`) refuse a pair whatever the model says. The model is a small
gradient-boosted tree ensemble shipped as JSON (`verifier_model.json`, written by
`python -m loadtests.train_verifier` from public data; see that script for data and splits) and
evaluated here in pure Python: no training library at run time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np

from gateway.cache.near_miss_rules import identical, near_miss
from gateway.cache.pair_features import FEATURES, features

MODEL_PATH = Path(__file__).with_name("verifier_model.json")


class Verifier:
    """Probability that two questions are the same question (to serve one's answer)."""

    def __init__(self, model: dict) -> None:
        if tuple(model["features"]) != FEATURES:
            raise ValueError("verifier model was trained on other features; retrain it")
        self.init = float(model["init"])
        self.rate = float(model["learning_rate"])
        # Every tree padded to a complete tree of the model's depth (a leaf above the bottom
        # becomes splits that always go left), stored in heap order: from node i a pair goes to
        # 2i+1 or 2i+2. Each distinct split is compared once per pair, then all trees are walked
        # together with one gather per level (~70 us for 900 trees and one pair; walking the
        # trees' own node tables took 1.3-1.6x as long, measured side by side).
        trees = model["trees"]
        self._depth = int(model.get("depth", 0)) or max(_depth_of(t) for t in trees)
        if not 1 <= self._depth <= 12:  # the padded table holds 2**depth leaves per tree
            raise ValueError(f"verifier model: depth {self._depth} is outside 1..12")
        # scikit-learn's GradientBoosting trees compare float32 inputs: compare the same values,
        # or a feature within a float32 rounding of a split goes the other way.
        self._dtype = np.float32 if model.get("input") == "float32" else np.float64
        self._inner = inner = 2**self._depth - 1  # heap positions below are leaves
        splits: dict[tuple[int, float], int] = {(0, math.inf): 0}  # 0: always left
        split_of = np.zeros((len(trees), inner), dtype=np.intp)
        value_of = np.zeros((len(trees), inner + 1))
        for i, t in enumerate(trees):
            _pad(t, 0, 0, 0, self._depth, splits, split_of[i], value_of[i])
        self._split_feature = np.array([f for f, _ in splits], dtype=np.intp)
        self._split_threshold = np.array([th for _, th in splits])
        self._split_of = split_of.ravel()
        self._value_of = value_of.ravel()
        self._offset = (np.arange(len(trees)) * inner)[None, :]
        self._leaf_offset = (np.arange(len(trees)) * (inner + 1))[None, :]
        self.threshold = float(model["threshold"])
        """Default decision threshold on the probability (chosen on the tune split)."""
        self.retrieval_floor = float(model["retrieval_floor"])
        """Candidates below this cosine are never verified (the model never saw them)."""

    def probability(self, query: str, candidate: str, cosine: float) -> float:
        return self.pair_probabilities([(query, candidate, cosine)])[0]

    def probabilities(self, query: str, candidates: list[tuple[str, float]]) -> list[float]:
        """The probability for each (cached question, cosine), the trees walked once for all."""
        return self.pair_probabilities([(query, c, cosine) for c, cosine in candidates])

    def pair_probabilities(self, pairs: Sequence[tuple[str, str, float]]) -> list[float]:
        """The probability for each (question, cached question, cosine), in one walk of the
        trees: candidates judged by their clauses each bring a pair of their own."""
        out = [1.0 if identical(q, c) else -1.0 for q, c, _ in pairs]
        for i, (q, c, _) in enumerate(pairs):
            # a modifier added or another member of a kind named: another question, whatever
            # the trees say (they served such pairs of domains they never saw)
            if out[i] < 0 and near_miss(q, c) is not None:
                out[i] = 0.0
        todo = [i for i, p in enumerate(out) if p < 0]
        if todo:
            xs = [features(*pairs[i]) for i in todo]
            for i, p in zip(todo, self.probabilities_of(xs), strict=True):
                out[i] = p
        return out

    def probability_of(self, x: list[float]) -> float:
        return self.probabilities_of([x])[0]

    def probabilities_of(self, xs: list[list[float]]) -> list[float]:
        x = np.asarray(xs, dtype=self._dtype)  # (pairs, features)
        # `np.take` rather than fancy indexing: the same elements, 1.4-1.7x faster for 4-8
        # pairs (a hit's candidates), measured; the walk runs under the index lock.
        splits = len(self._split_feature)
        right = (np.take(x, self._split_feature, axis=1) > self._split_threshold).ravel()
        row = (np.arange(len(x)) * splits)[:, None]  # each pair's run of `right`
        node = np.zeros((len(x), self._offset.shape[1]), dtype=np.intp)
        for _ in range(self._depth):
            split = np.take(self._split_of, self._offset + node)
            node = 2 * node + 1 + np.take(right, row + split)
        leaf = self._leaf_offset + node - self._inner
        scores = self.init + self.rate * np.take(self._value_of, leaf).sum(axis=1)
        # A feature that is not a number (a broken vector upstream of here) would walk the
        # trees by accident: such a pair is never the same question.
        finite = np.isfinite(x).all(axis=1)
        return [
            1.0 / (1.0 + math.exp(-float(s))) if ok else 0.0
            for s, ok in zip(scores, finite, strict=True)
        ]


def _depth_of(tree: dict, node: int = 0) -> int:
    if tree["left"][node] < 0:
        return 0
    return 1 + max(_depth_of(tree, tree["left"][node]), _depth_of(tree, tree["right"][node]))


def _pad(
    tree: dict,
    node: int,
    heap: int,
    level: int,
    depth: int,
    splits: dict[tuple[int, float], int],
    split_of: np.ndarray,
    value_of: np.ndarray,
) -> None:
    """Writes `tree`'s subtree at `node` into heap position `heap` of a complete tree."""
    if level == depth:
        if tree["left"][node] >= 0:
            raise ValueError("verifier model: a tree is deeper than the model's depth")
        value_of[heap - (2**depth - 1)] = tree["value"][node]  # leaves follow the inner nodes
        return
    lo, hi = tree["left"][node], tree["right"][node]
    if lo < 0:  # a leaf above the bottom: always left, the right side is never reached
        split_of[heap] = 0
        lo = hi = node
    else:
        key = (int(tree["feature"][node]), float(tree["threshold"][node]))
        split_of[heap] = splits.setdefault(key, len(splits))
    _pad(tree, lo, 2 * heap + 1, level + 1, depth, splits, split_of, value_of)
    _pad(tree, hi, 2 * heap + 2, level + 1, depth, splits, split_of, value_of)


@cache
def default_verifier() -> Verifier:
    """The shipped model (loaded once)."""
    return Verifier(json.loads(MODEL_PATH.read_text(encoding="utf-8")))
