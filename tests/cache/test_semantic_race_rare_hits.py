"""Where new questions rarely find an answer, a new question goes upstream at once and races
its lookup (`semantic_cache.race_rare_hits`, 5% by default): a miss then does not wait for its
embedding. Counted per route over the lookups that embed (a question in the vector memo does
not), raced or not, after 20 of them; only where the upstream is slower than two lookups, so a
paraphrase is still served first. Once hits become common, new questions wait again.

Real gateway, real embedder and verifier, the project's simulators through the HTTP API: `low`
(~120 ms for 8 tokens; made slower where shown) and `zero` (no delay at all). The word gate
(`race_unrelated`) is off here so that only this rule races.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.cache.test_cache_semantic_namespaces import _metric, ask, two_aliases
from tests.cache.test_semantic_race_unrelated import EARLY, RACED, served_first, stored
from tests.conftest import DEFAULT_FLEET
from tests.support import GatewayServer

pytest.importorskip("faiss", reason="the semantic extra is not installed")

FLEET: list[Any] = [
    *DEFAULT_FLEET,
    {"name": "low", "profile": "low-latency"},
    {"name": "zero", "profile": "zero-latency"},
]
NO_WORD_GATE = "semantic_cache: {race_unrelated: false}\n"
RARE = 'gateway_semantic_lookups_total{guard="",outcome="early_rare_hits"}'
#: New questions, each a miss: none asks what another (or "How old are you?") asks.
MISSES = [
    "Which planets have rings?", "How do volcanoes form?", "Why is the sky blue?",
    "What causes the tides?", "How does a refrigerator keep food cold?",
    "Who painted the ceiling of the Sistine Chapel?", "What is the speed of sound in water?",
    "How many bones are in a cat's tail?", "Why do onions make people cry?",
    "What language is spoken in Brazil?", "How do bees make honey?",
    "What is the tallest mountain in Africa?", "Why do leaves change colour in autumn?",
    "How does a compass find north?", "What is the main ingredient of guacamole?",
    "How long does it take light to reach Earth from the Sun?",
    "Which metal conducts electricity best?", "How do submarines dive and surface?",
    "What do pandas eat in the wild?", "Why is seawater salty?",
    "How are rainbows formed?", "What is the capital city of Canada?",
    "How do vaccines train the immune system?", "Why do cats purr?",
]  # fmt: skip


def misses(gw: GatewayServer, ns: str, questions: list[str]) -> None:
    for q in questions:
        r = ask(gw, q, namespace=ns)
        assert r.headers["x-gateway-cache"] == "miss", q


def test_new_questions_are_raced_where_they_rarely_hit(fleet: Any) -> None:
    with GatewayServer(two_aliases(fleet.url("low"), NO_WORD_GATE)) as gw:
        ns = f"rare-{uuid.uuid4().hex}"
        answer = stored(gw, "How old are you?", ns)
        # 20 new questions, all misses: each waits for its lookup (too few seen to judge).
        misses(gw, ns, MISSES[:20])
        assert _metric(gw, EARLY) == 0
        # Now 0 hits in 20: the next new question goes upstream at once (and is a miss).
        misses(gw, ns, MISSES[20:21])
        assert _metric(gw, EARLY) == 1
        # A paraphrase is raced too, and its lookup still answers before the slow upstream,
        # whose call is cancelled and not billed.
        served_first(fleet, "low", gw, "What is your age?", ns, answer)
        assert (_metric(gw, EARLY), _metric(gw, RACED)) == (2, 1)
        # A question asked verbatim again (its vector in the memo: no embedding) waits.
        again = ask(gw, "How old are you?", namespace=ns)
        assert again.headers["x-gateway-cache"] == "hit-semantic"
        assert _metric(gw, EARLY) == 2
        # 1 hit in 22 (4.5%) is still rare: raced, served. 2 in 23 (8.7%) is not: the next
        # new question waits for its lookup again.
        served_first(fleet, "low", gw, "How old are you, please?", ns, answer)
        assert (_metric(gw, EARLY), _metric(gw, RACED)) == (3, 2)
        misses(gw, ns, MISSES[21:24])
        assert (_metric(gw, EARLY), _metric(gw, RARE)) == (3, 3)


@pytest.mark.parametrize(
    ("upstream", "extra"),
    [
        ("low", "semantic_cache: {race_unrelated: false, race_rare_hits: 0}\n"),
        ("zero", NO_WORD_GATE),
    ],
    ids=["setting-off", "upstream-faster-than-a-lookup"],
)
def test_nothing_is_raced_when_off_or_against_a_fast_upstream(
    fleet: Any, upstream: str, extra: str
) -> None:
    with GatewayServer(two_aliases(fleet.url(upstream), extra)) as gw:
        ns = f"rare-{uuid.uuid4().hex}"
        answer = stored(gw, "How old are you?", ns)
        misses(gw, ns, MISSES[:22])
        r = ask(gw, "What is your age?", namespace=ns)
        assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer
        assert _metric(gw, EARLY) == 0


@pytest.mark.parametrize("value", ["-0.1", "1.5", "'often'"])
def test_a_bad_share_is_refused(fleet: Any, value: str) -> None:
    from gateway.policy import PolicyError, parse_policy

    text = two_aliases(fleet.url("low"), f"semantic_cache: {{race_rare_hits: {value}}}\n")
    with pytest.raises(PolicyError, match="race_rare_hits"):
        parse_policy(text)
