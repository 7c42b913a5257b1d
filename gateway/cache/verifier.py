"""The verifier: decides whether a retrieved candidate asks the same question as the new one.

Retrieval by embedding finds candidates whose cosine reaches `retrieval_floor`; this pair
classifier then scores each (new question, cached question) pair from `pair_features` and
serves the best candidate whose probability reaches the decision threshold. The model is a small
gradient-boosted tree ensemble shipped as JSON (`verifier_model.json`, written by
`python -m loadtests.train_verifier` from public data; see that script for data and splits) and
evaluated here in pure Python: no training library at run time.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np

from gateway.cache.pair_features import FEATURES, features, identical

MODEL_PATH = Path(__file__).with_name("verifier_model.json")


class Verifier:
    """Probability that two questions are the same question (to serve one's answer)."""

    def __init__(self, model: dict) -> None:
        if tuple(model["features"]) != FEATURES:
            raise ValueError("verifier model was trained on other features; retrain it")
        self.init = float(model["init"])
        self.rate = float(model["learning_rate"])
        # All trees as one padded table, walked together with numpy: a leaf points to itself, so
        # `depth` steps from the roots land every tree on its leaf (~20 µs for 300 trees).
        trees = model["trees"]
        width = max(len(t["feature"]) for t in trees)
        n = len(trees)
        self._feature = np.zeros((n, width), dtype=np.intp)
        self._threshold = np.full((n, width), np.inf)
        self._left = np.tile(np.arange(width), (n, 1))
        self._right = self._left.copy()
        self._value = np.zeros((n, width))
        for i, t in enumerate(trees):
            for node, (f, th, lo, hi, v) in enumerate(
                zip(t["feature"], t["threshold"], t["left"], t["right"], t["value"], strict=True)
            ):
                self._value[i, node] = v
                if lo >= 0:
                    self._feature[i, node], self._threshold[i, node] = f, th
                    self._left[i, node], self._right[i, node] = lo, hi
        self._depth = int(model.get("depth", 0)) or width
        self._rows = np.arange(n)
        # scikit-learn's GradientBoosting trees compare float32 inputs: compare the same values,
        # or a feature within a float32 rounding of a split goes the other way.
        self._dtype = np.float32 if model.get("input") == "float32" else np.float64
        self.threshold = float(model["threshold"])
        """Default decision threshold on the probability (chosen on the tune split)."""
        self.retrieval_floor = float(model["retrieval_floor"])
        """Candidates below this cosine are never verified (the model never saw them)."""

    def probability(self, query: str, candidate: str, cosine: float) -> float:
        return self.probabilities(query, [(candidate, cosine)])[0]

    def probabilities(self, query: str, candidates: list[tuple[str, float]]) -> list[float]:
        """The probability for each (cached question, cosine), the trees walked once for all:
        a lookup judges up to top_k candidates, and the walk costs the same for one or four."""
        out = [1.0 if identical(query, c) else -1.0 for c, _ in candidates]
        todo = [i for i, p in enumerate(out) if p < 0]
        if todo:
            xs = [features(query, candidates[i][0], candidates[i][1]) for i in todo]
            for i, p in zip(todo, self.probabilities_of(xs), strict=True):
                out[i] = p
        return out

    def probability_of(self, x: list[float]) -> float:
        return self.probabilities_of([x])[0]

    def probabilities_of(self, xs: list[list[float]]) -> list[float]:
        x = np.asarray(xs, dtype=self._dtype)  # (pairs, features)
        rows = self._rows
        pair = np.arange(len(x))[:, None]
        node = np.zeros((len(x), len(rows)), dtype=np.intp)
        for _ in range(self._depth):
            go_left = x[pair, self._feature[rows, node]] <= self._threshold[rows, node]
            node = np.where(go_left, self._left[rows, node], self._right[rows, node])
        scores = self.init + self.rate * self._value[rows, node].sum(axis=1)
        return [1.0 / (1.0 + math.exp(-float(s))) for s in scores]


@cache
def default_verifier() -> Verifier:
    """The shipped model (loaded once)."""
    return Verifier(json.loads(MODEL_PATH.read_text(encoding="utf-8")))
