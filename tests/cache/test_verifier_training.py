"""The verifier's training pipeline: mined negatives stay inside their split and file and never
pair two wordings of one question; an exported model scores exactly as the trainer does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.cache.pair_features import FEATURES, features
from gateway.cache.verifier import Verifier
from loadtests.verifier_data import Pair, mine_negatives


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_mined_negatives_stay_in_their_file_and_skip_paraphrases() -> None:
    pairs = [
        Pair("a1", "a2", 1, "paraphrase", "written", "train", origin="f1"),
        Pair("a2", "a3", 1, "paraphrase", "written", "train", origin="f1"),  # a1 ~ a3 by chain
        Pair("b1", "b2", 0, "related", "written", "train", origin="f1"),
        Pair("c1", "c2", 1, "paraphrase", "written", "train", origin="f2"),
        Pair("p1", "p2", 1, "paws", "paws", "train"),
    ]
    vectors = {
        "a1": _unit(1, 0.1, 0),
        "a2": _unit(1, 0.2, 0),
        "a3": _unit(1, 0.3, 0),
        "b1": _unit(1, 0.9, 0),  # close to the a's: cosine ~0.8
        "b2": _unit(1, 1.0, 0.1),
        "c1": _unit(1, 0.1, 0.01),  # as close to a1 as a2, but in another file
        "c2": _unit(1, 0.2, 0.01),
    }
    mined = mine_negatives(pairs, vectors, per_question=4, floor=0.6, ceiling=0.995)
    assert mined, "the b questions are near the a questions"
    texts = {t for m in mined for t in (m.s1, m.s2)}
    assert not texts & {"c1", "c2", "p1", "p2"}
    group_a = {"a1", "a2", "a3"}
    for m in mined:
        assert m.label == 0 and m.source == "mined" and m.split == "train"
        assert not ({m.s1, m.s2} <= group_a), "two wordings of one question are no negative"
        assert {m.s1, m.s2} != {"b1", "b2"}, "a labelled pair is not mined again"
        assert 0.6 <= m.cosine < 0.995


def test_mined_negatives_stop_below_the_ceiling() -> None:
    pairs = [
        Pair("x", "x2", 0, "related", "written", "tune", origin="f"),
        Pair("y", "y2", 0, "related", "written", "tune", origin="f"),
    ]
    vectors = {"x": _unit(1, 0), "x2": _unit(0, 1), "y": _unit(1, 0.01), "y2": _unit(0.1, 1)}
    mined = mine_negatives(pairs, vectors, per_question=2, floor=0.6, ceiling=0.9)
    assert all(m.cosine < 0.9 for m in mined)
    assert not any({m.s1, m.s2} == {"x", "y"} for m in mined), "near duplicates are left out"


@pytest.mark.parametrize("learner", ["gbt", "hgb"])
def test_exported_model_scores_as_trained(learner: str) -> None:
    pytest.importorskip("sklearn", reason="scikit-learn (training only) is not installed")
    from sklearn.ensemble import GradientBoostingClassifier, HistGradientBoostingClassifier

    from loadtests.train_verifier import export

    rng = np.random.default_rng(0)
    # ratios of small counts: many inputs sit exactly on a split's threshold
    x = np.round(rng.random((400, len(FEATURES))) * 6) / 6
    x[:, 0] = rng.random(400)
    y = (x[:, 0] + x[:, 1] + 0.3 * rng.random(400) > 1.0).astype(int)
    model = (
        GradientBoostingClassifier(n_estimators=40, max_depth=3, random_state=0)
        if learner == "gbt"
        else HistGradientBoostingClassifier(max_iter=40, max_leaf_nodes=8, random_state=0)
    )
    model.fit(x, y)
    runtime = Verifier(export(model, 0.5, {}))
    expected = model.predict_proba(x)[:, 1]
    got = np.array([runtime.probability_of(list(row)) for row in x])
    assert np.abs(got - expected).max() < 1e-5


def test_seed_averaged_models_export_as_one_table() -> None:
    """The shipped model averages the log-odds of models fit with other seeds; its exported
    table must score as that average does."""
    pytest.importorskip("sklearn", reason="scikit-learn (training only) is not installed")
    from sklearn.ensemble import GradientBoostingClassifier

    from loadtests.train_verifier import Bagged, export

    rng = np.random.default_rng(1)
    x = np.round(rng.random((300, len(FEATURES))) * 6) / 6
    y = (x[:, 0] + x[:, 2] + 0.4 * rng.random(300) > 1.1).astype(int)
    w = np.where(x[:, 3] > 0.5, 2.0, 1.0)
    models = [
        GradientBoostingClassifier(n_estimators=30, max_depth=3, subsample=0.8, random_state=s).fit(
            x, y, sample_weight=w
        )
        for s in (0, 1, 2)
    ]
    bagged = Bagged(models)
    mean_logit = np.mean([m.decision_function(x) for m in models], axis=0)
    assert np.allclose(bagged.predict_proba(x)[:, 1], 1 / (1 + np.exp(-mean_logit)))
    table = export(bagged, 0.5, {})
    assert len(table["trees"]) == 90
    runtime = Verifier(table)
    got = np.array(runtime.probabilities_of([list(row) for row in x]))
    assert np.abs(got - bagged.predict_proba(x)[:, 1]).max() < 1e-5


def test_a_pair_with_a_feature_not_a_number_is_never_served() -> None:
    from gateway.cache.verifier import default_verifier

    v = default_verifier()
    row = features("How do I reset my password?", "How do I reset my password?!", 0.99)
    assert v.probability_of(row) >= v.threshold
    for bad in (math.nan, math.inf):
        broken = list(row)
        broken[0] = bad
        assert v.probabilities_of([broken, row]) == [0.0, v.probability_of(row)]


def test_candidates_judged_together_score_as_alone() -> None:
    from gateway.cache.verifier import default_verifier

    v = default_verifier()
    asked = "How do I reset my password on my phone?"
    candidates = [
        ("How do I reset my password on my phone?", 0.99),  # identical: 1.0 without the model
        ("How can I change my phone password?", 0.91),
        ("How do I reset my phone to factory settings?", 0.84),
        ("What is a strong password?", 0.66),
    ]
    together = v.probabilities(asked, candidates)
    alone = [v.probability(asked, c, cos) for c, cos in candidates]
    assert together[0] == 1.0
    assert together == pytest.approx(alone, abs=1e-12)
    assert v.probabilities(asked, []) == []


def test_the_unseen_set_is_evaluation_only_and_shares_nothing_with_training() -> None:
    from loadtests.verifier_data import load_chat, load_unseen, load_written

    unseen = load_unseen()
    assert len(unseen) > 1000
    assert {p.split for p in unseen} == {"holdout"} and {p.source for p in unseen} == {"unseen"}
    trained = {t.lower() for p in load_written() + load_chat() for t in (p.s1, p.s2)}
    assert not {t.lower() for p in unseen for t in (p.s1, p.s2)} & trained
    # and the trainer never loads it
    import inspect

    import loadtests.train_verifier as tv

    assert "load_unseen" not in inspect.getsource(tv)
    assert "load_order_probe" not in inspect.getsource(tv)
    assert "load_probe" not in inspect.getsource(tv)
    assert "PROBES" not in inspect.getsource(tv)
    from loadtests.verifier_data import augment

    assert "order_probe" not in inspect.getsource(augment)
    assert "forum_probe" not in inspect.getsource(augment)
    assert "kinds_probe" not in inspect.getsource(augment)


def test_derived_name_swaps_are_labelled_by_what_they_change() -> None:
    """Two coordinated names exchanged keep the question (label 1); two roles exchanged do not
    (label 0); a phrase moved ("in Milan in March") is not taught either way; the parts of one
    name are never split ("Los Angeles")."""
    import random

    from loadtests.verifier_data import _swap_conjuncts, _swap_names

    rng = random.Random(0)
    assert _swap_names("What's the distance between Milan and Barcelona?", rng) == (
        "What's the distance between Barcelona and Milan?", 1)  # fmt: skip
    assert _swap_names("Which is older, Oxford or Cambridge?", rng) == (
        "Which is older, Cambridge or Oxford?", 1)  # fmt: skip
    assert _swap_names("Did Spain beat Argentina in the final?", rng) == (
        "Did Argentina beat Spain in the final?", 0)  # fmt: skip
    assert _swap_names("How long is the ferry from Dover to Calais?", rng) == (
        "How long is the ferry from Calais to Dover?", 0)  # fmt: skip
    assert _swap_names("What's the weather like in Milan in March?", rng) is None
    assert _swap_names("Why was the Battle of Gettysburg a turning point?", rng) is None
    assert _swap_names("What is the time difference between London and Los Angeles?", rng) == (
        "What is the time difference between Los Angeles and London?", 1)  # fmt: skip
    assert _swap_conjuncts("What's the difference between a cold and the flu?", rng) == (
        "What's the difference between the flu and a cold?")  # fmt: skip
    assert _swap_conjuncts("Is it safe to mix bleach and ammonia?", rng) == (
        "Is it safe to mix ammonia and bleach?")  # fmt: skip
    # "baking soda and vinegar": the first thing is two words, so no swap is attempted
    assert _swap_conjuncts("What happens when you mix baking soda and vinegar?", rng) is None
    assert _swap_conjuncts("How do I move from Windows and macOS to Linux?", rng) is None


def test_operators_are_words_and_only_comparisons_count_as_operators() -> None:
    from gateway.cache.pair_features import _text

    t = _text("Why does `x == None` fail but `x is None` works?")
    assert t.words == ["why", "does", "x", "==", "none", "fail", "but", "x", "is", "none", "works"]
    assert t.operators == ("==",)
    assert _text("sliced apple going brown - what causes it").operators == ()


def test_negation_said_with_a_verb_counts_as_negation() -> None:
    """ "not eat" and "avoid" ask the same thing; "eat" and "avoid" do not; nor do "contain
    sugar" and "sugar-free", which "no sugar" asks."""
    from gateway.cache.pair_features import FEATURES, features

    at = FEATURES.index("negation_differs")
    same = [
        (
            "Which foods should I not eat while pregnant?",
            "Which foods should I avoid while pregnant?",
        ),
        ("What can't I feed my rabbit?", "What should I stay away from feeding my rabbit?"),
        ("Why is my soil not draining?", "Why does my soil lack drainage?"),
        # negation in an affix
        ("Which snacks have no sugar?", "Which snacks are sugar-free?"),
        ("Can I get headphones without a cable?", "Can I get cableless headphones?"),
        ("Can people who are not residents open an account?", "Can non-residents open an account?"),
        # "unless" is "if not"
        ("Why does it fail unless I restart?", "Why does it fail if I don't restart?"),
    ]
    other = [
        ("What should I eat before a long run?", "What should I avoid before a long run?"),
        ("Which apps can I trust?", "Which apps should I steer clear of?"),
        ("Which snacks contain sugar?", "Which snacks are sugar-free?"),
        ("Is this process toxic?", "Is this process non-toxic?"),
        ("Why is my app useful?", "Why is my app useless?"),
        ("Why does it fail unless I restart?", "Why does it fail when I restart?"),
    ]
    assert [features(a, b, 0.9)[at] for a, b in same] == [0.0] * len(same)
    assert [features(a, b, 0.9)[at] for a, b in other] == [1.0] * len(other)


def _run_module(*argv: str) -> str:
    """What `python -m argv...` prints, asserting it succeeded."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_threshold_table_runs() -> None:
    """`python -m loadtests.verifier_thresholds` (the README's table) prints a row per threshold."""
    out = _run_module("loadtests.verifier_thresholds", "--thresholds", "0.7,0.9")
    rows = [line for line in out.splitlines() if line.startswith("| 0.")]
    assert [r.split(" | ")[0] for r in rows] == ["| 0.70", "| 0.90"]


def test_the_http_quality_run_matches_the_offline_protocol() -> None:
    """`python -m loadtests.semantic_http_quality` (GPTCache's protocol through a real gateway
    process and the `openai` client) serves what the offline computation of the same protocol
    says, give or take the stores of missed questions the offline one does not make."""
    import re

    out = _run_module("loadtests.semantic_http_quality", "--sets", "chat")
    row = next(line for line in out.splitlines() if line.startswith("| chat |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    right, wrong, miss = map(int, re.findall(r"\d+", cells[2]))
    offline_right, offline_wrong = map(int, re.findall(r"\d+", cells[4]))
    assert right + wrong + miss == 74  # every paraphrase asked once
    assert abs(right - offline_right) <= 4 and wrong <= offline_wrong + 3
    assert right >= 40  # the cache serves through HTTP at all


def test_the_lookup_latency_run_serves_first_rewordings() -> None:
    """`python -m loadtests.semantic_lookup_latency`: first rewordings of stored questions, one
    at a time in-process, are served (what it times are hits), short and long."""
    out = _run_module("loadtests.semantic_lookup_latency", "--questions", "4", "--pause-ms", "1")
    lines = [line for line in out.splitlines() if "lookup p50" in line]
    assert [line.split(":")[0] for line in lines] == ["short", "long"], out
    assert all("outcomes {'hit': 4}" in line for line in lines), out
