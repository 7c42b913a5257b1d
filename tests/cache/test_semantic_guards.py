"""Near-miss guards of the semantic cache (pure text checks, no model)."""

from __future__ import annotations

import pytest

from gateway.cache.guards import check, each_alone
from gateway.cache.semantic_settings import GuardSettings

ALL = GuardSettings()

REJECTED = [
    ("How many calories are in 2 eggs?", "How many calories are in 3 eggs?", "number"),
    ("How many calories are in two eggs?", "How many calories are in 3 eggs?", "number"),
    ("Is 7 bigger than 9?", "Is 9 bigger than 7?", "number"),
    ("Book a table for four people", "Book a table for five people", "number"),
    ("Tell me about the First World War", "Tell me about the Second World War", "number"),
    ("Is it safe to take ibuprofen with coffee?", "Is it not safe to take ibuprofen with coffee?",
     "negation"),
    ("Why does my laptop turn on?", "Why won't my laptop turn on?", "negation"),
    ("Coffee with sugar recipe", "Coffee without sugar recipe", "negation"),
    ("How far is Paris from Lyon?", "How far is Paris from Nice?", "entity"),
    ("What is the capital of Austria?", "What is the capital of Australia?", "entity"),
    ("Did Germany beat Brazil in 2014?", "Did Brazil beat Germany in 2014?", "entity_order"),
    ("Did Germany beat Brazil in 2014?", "Was Germany beaten by Brazil in 2014?", "entity_order"),
]  # fmt: skip

ACCEPTED = [
    ("How many calories are in two eggs?", "How many calories are in 2 eggs?"),
    ("Convert 5,000 dollars to euros", "convert five thousand dollars to euros"),
    ("how far is paris from lyon", "How far is Paris from Lyon?"),
    ("Compare Python and Java", "Compare Java and Python"),
    ("Did Germany beat Brazil in 2014?", "Was Brazil beaten by Germany in 2014?"),
    ("Why won't my laptop turn on?", "My laptop does not turn on, why?"),
    ("Which one is better for beginners?", "Which is better for beginners?"),
    ("Explain Kubernetes to me", "What is Kubernetes?"),
    ("I'm going to Tokyo, what should I pack?", "What should I pack for my trip to Tokyo?"),
    # texts once rejected against themselves
    ("How much does an iPhone 4S weigh?", "How much does an iPhone 4S weigh?"),
    ("How do I print a 3D model?", "How do I print a 3D model?"),
    ("Is 50MG of zinc a day too much?", "Is 50MG of zinc a day too much?"),
    ("Who is QVC's Lisa Robertson?", "Who is QVC's Lisa Robertson?"),
]


@pytest.mark.parametrize(("query", "candidate", "guard"), REJECTED)
def test_near_misses_are_rejected(query: str, candidate: str, guard: str) -> None:
    assert check(query, candidate, ALL) == guard
    assert check(candidate, query, ALL) == guard


@pytest.mark.parametrize(("query", "candidate"), ACCEPTED)
def test_paraphrases_pass(query: str, candidate: str) -> None:
    assert check(query, candidate, ALL) is None
    assert check(candidate, query, ALL) is None


def test_each_guard_alone_as_check_says_with_that_guard_on() -> None:
    # The verifier's features read all four in one pass (`each_alone`): the same answers.
    off = GuardSettings(numbers=False, negation=False, entities=False, entity_order=False)
    pairs = [(q, c) for q, c, _ in REJECTED] + ACCEPTED
    pairs += [("Is 7 bigger than 9 or 3?", "Is 9 or 3 bigger than 7?"),
              ("Flights from 3 to 5 pm", "Flights from 5 to 3 pm")]  # fmt: skip
    for q, c in pairs + [(c, q) for q, c in pairs]:
        alone = each_alone(q, c)
        assert list(alone) == ["numbers", "negation", "entities", "entity_order"]
        for name, rejects in alone.items():
            assert rejects == (check(q, c, off.model_copy(update={name: True})) is not None)


def test_each_guard_can_be_switched_off() -> None:
    off = {
        "number": GuardSettings(numbers=False),
        "negation": GuardSettings(negation=False),
        "entity": GuardSettings(entities=False),
        "entity_order": GuardSettings(entity_order=False),
    }
    for query, candidate, guard in REJECTED:
        if guard == "number" and "World War" in query:
            continue  # ordinals: also an order-free case, covered above
        assert check(query, candidate, off[guard]) != guard, (query, candidate)
    nothing = GuardSettings(numbers=False, negation=False, entities=False, entity_order=False)
    assert all(check(q, c, nothing) is None for q, c, _ in REJECTED)


VERIFIER_NEAR_MISSES = [
    ("Translate this sentence from Spanish to English",
     "Translate this sentence from English to Spanish"),
    ("Did Brazil beat Germany in the 2014 World Cup?",
     "Did Germany beat Brazil in the 2014 World Cup?"),
    ("Select users where age < 30", "Select users where age > 30"),
    ("How do I enable dark mode?", "How do I disable dark mode?"),
    ("Wake me up at 6 am", "Wake me up at 6 pm"),
    ("In SQL, how do I select users whose status is active and whose role is admin?",
     "In SQL, how do I select users whose status is active or whose role is admin?"),
    ("Can I log in without my phone if I have two-factor authentication on?",
     "Can I log in without my phone if I don't have two-factor authentication on?"),
]  # fmt: skip
VERIFIER_SAME = [
    ("How much does an iPhone 4S weigh?", "how much does an iphone 4s weigh"),
    ("What is the boiling point of water?", "At what temperature does water boil?"),
    ("Can I take aspirin with alcohol?", "Is it safe to take aspirin and alcohol together?"),
    # function words edited, content words kept in order
    ("What is the best time of year to visit Iceland?",
     "When is the best time of the year to visit Iceland?"),
    ("What is the best time of year to visit Iceland?",
     "what's the best time of year to visit iceland"),
    ("How do I install Docker on Ubuntu?", "Could you tell me how I can install Docker on Ubuntu?"),
]  # fmt: skip


@pytest.mark.parametrize(("cached", "asked"), VERIFIER_NEAR_MISSES)
def test_verifier_refuses_near_misses_the_embedding_accepts(cached: str, asked: str) -> None:
    from gateway.cache.verifier import default_verifier

    v = default_verifier()
    # at the cosine the embedder gives such pairs (>= 0.9), the verifier still says no
    assert v.probability(asked, cached, 0.97) < v.threshold


@pytest.mark.parametrize(("cached", "asked"), VERIFIER_SAME)
def test_verifier_accepts_same_questions(cached: str, asked: str) -> None:
    from gateway.cache.verifier import default_verifier

    v = default_verifier()
    assert v.probability(asked, cached, 0.93) >= v.threshold


def test_words_of_any_script_count() -> None:
    """Two unrelated questions in Chinese or Russian must not look lexically identical."""
    from gateway.cache.pair_features import FEATURES, features

    jaccard = FEATURES.index("word_jaccard")
    char3 = FEATURES.index("char3_jaccard")
    for a, b in [("如何重置我的密码？", "北京今天的天气怎么样？"),
                 ("Как сбросить пароль?", "Какая погода в Москве?")]:  # fmt: skip
        x = features(b, a, 0.9)
        assert x[jaccard] == 0.0 and x[char3] < 0.2


def _lcs_table(a: list[str], b: list[str]) -> int:
    """The textbook dynamic programme, to check the bit-parallel one against."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_word_lcs_matches_the_dynamic_programme() -> None:
    import random

    from gateway.cache.pair_features import _lcs

    rnd = random.Random(7)
    for _ in range(3000):
        a = [rnd.choice("abcdef") for _ in range(rnd.randint(0, 70))]  # past 64 bits too
        b = [rnd.choice("abcdefg") for _ in range(rnd.randint(0, 70))]
        assert _lcs(a, b) == _lcs_table(a, b)
    words = ["how", "do", "i", "reset", "my", "iphone", "password"]
    assert _lcs(words, words) == len(words)
    assert _lcs(words, list(reversed(words))) == 1


def test_contractions_read_as_their_words() -> None:
    """ "What's" is "what (is)", "don't" is "do not": a contraction is no content word of its own,
    and a negation stays a negation."""
    from gateway.cache.pair_features import FEATURES, _text, features

    assert _text("What's the capital of Australia's state?").words == [
        "what", "the", "capital", "of", "australia", "state",
    ]  # fmt: skip
    assert _text("I don't know, we can't").words == ["i", "do", "not", "know", "we", "can", "not"]
    assert _text("I dont know").words == _text("I don't know").words
    x = dict(
        zip(
            FEATURES,
            features("what's the best time to go", "What is the best time to go?", 0.95),
            strict=True,
        )
    )
    assert x["only_q"] == x["only_c"] == 0
    y = dict(zip(FEATURES, features("Is it safe?", "Isn't it safe?", 0.95), strict=True))
    assert y["negation_differs"] == 1


def test_negations_are_counted_not_just_seen() -> None:
    from gateway.cache.pair_features import FEATURES, features

    x = features(
        "Can I log in without my phone if I don't have 2FA on?",
        "Can I log in without my phone if I have 2FA on?",
        0.99,
    )
    assert dict(zip(FEATURES, x, strict=True))["negation_differs"] == 1


def test_and_or_swap_and_asked_kinds() -> None:
    from gateway.cache.pair_features import FEATURES, features

    def f(a: str, b: str) -> dict[str, float]:
        return dict(zip(FEATURES, features(a, b, 0.95), strict=True))

    assert (
        f("select rows where a = 1 and b = 2", "select rows where a = 1 or b = 2")["and_or_swap"]
        == 1
    )
    assert f("tea and coffee", "coffee and tea")["and_or_swap"] == 0
    assert f("Why does my cat knead?", "How do I stop my cat kneading?")["asks_differ"] == 1
    # a unit says what kind of amount is asked: "how many minutes" asks how long
    assert (
        f("How long should I steep tea?", "How many minutes should tea steep?")["asks_differ"] == 0
    )
    assert f("How far is Rome from Naples?", "How many km from Rome to Naples?")["asks_differ"] == 0
    assert (
        f("How often should I water ferns?", "How many times a week do ferns need water?")[
            "asks_differ"
        ]
        == 0
    )
    assert f("How long should I steep tea?", "How many cups of tea a day?")["asks_differ"] == 1
    assert (
        f("When is the best time to visit?", "What is the best time to visit?")["asks_match"] == 1
    )
