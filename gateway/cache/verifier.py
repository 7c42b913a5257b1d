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
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gateway.cache.pair_features import FEATURES, features, identical

MODEL_PATH = Path(__file__).with_name("verifier_model.json")


@dataclass(frozen=True, slots=True)
class _Tree:
    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    value: tuple[float, ...]

    def predict(self, x: list[float]) -> float:
        node = 0
        left, feature = self.left, self.feature
        while left[node] >= 0:
            node = left[node] if x[feature[node]] <= self.threshold[node] else self.right[node]
        return self.value[node]


class Verifier:
    """Probability that two questions are the same question (to serve one's answer)."""

    def __init__(self, model: dict) -> None:
        if tuple(model["features"]) != FEATURES:
            raise ValueError("verifier model was trained on other features; retrain it")
        self.init = float(model["init"])
        self.rate = float(model["learning_rate"])
        self.trees = [
            _Tree(
                tuple(t["feature"]),
                tuple(t["threshold"]),
                tuple(t["left"]),
                tuple(t["right"]),
                tuple(t["value"]),
            )
            for t in model["trees"]
        ]
        self.threshold = float(model["threshold"])
        """Default decision threshold on the probability (chosen on the tune split)."""
        self.retrieval_floor = float(model["retrieval_floor"])
        """Candidates below this cosine are never verified (the model never saw them)."""

    def probability(self, query: str, candidate: str, cosine: float) -> float:
        if identical(query, candidate):
            return 1.0
        x = features(query, candidate, cosine)
        score = self.init + self.rate * sum(t.predict(x) for t in self.trees)
        return 1.0 / (1.0 + math.exp(-score))


@cache
def default_verifier() -> Verifier:
    """The shipped model (loaded once)."""
    return Verifier(json.loads(MODEL_PATH.read_text(encoding="utf-8")))
