"""Units of the semantic cache's narrower judgements: the clauses two long texts differ in, texts
past the model's token limit whatever their length in characters, operators in code."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.cache.pair_features import _text
from gateway.cache.semantic import namespace_for
from gateway.cache.shared_context import clauses, differing_clauses

pytest.importorskip("faiss", reason="the semantic extra is not installed")

CONTEXT = (
    "My team maintains a Django app with a Postgres database and about forty models. "
    "We deploy it twice a week with a small CI pipeline."
)


@contextlib.contextmanager
def trees_watched(cache: Any) -> Iterator[list[list[str]]]:
    """The candidate texts of each call of the cache's verifier trees, while in the block (the
    verifier is shared by the process's caches: restored after)."""
    verifier = cache.verifier
    calls: list[list[str]] = []
    if verifier is None:
        yield calls
        return
    judge = verifier.pair_probabilities

    def watched(pairs: list[tuple[str, str, float]]) -> list[float]:
        calls.append([c for _, c, _ in pairs])
        return judge(pairs)

    verifier.pair_probabilities = watched
    try:
        yield calls
    finally:
        verifier.pair_probabilities = judge


async def threads_idle(worker: Any, threads: int) -> None:
    """Until `threads` of the embedder's threads are idle (a thread counts as busy until its
    job's futures are resolved)."""
    for _ in range(500):
        if worker.idle() >= threads:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the threads stayed busy")


def test_the_differing_clauses_of_texts_sharing_a_context() -> None:
    a = f"{CONTEXT} How do we speed up the test suite?"
    b = f"{CONTEXT} Which hosting provider is cheapest?"
    assert differing_clauses(a, b) == (
        "How do we speed up the test suite?",
        "Which hosting provider is cheapest?",
    )
    # The clause around a difference inside one sentence, not the whole text.
    s = "I noticed English uses Norse gods; which gods are Wednesday and Thursday named after?"
    t = s.replace("Wednesday and Thursday", "Tuesday and Friday")
    assert differing_clauses(s, t) == (
        "which gods are Wednesday and Thursday named after?",
        "which gods are Tuesday and Friday named after?",
    )


def test_short_or_unrelated_texts_are_left_to_the_verifier() -> None:
    assert differing_clauses("How do I learn Python?", "How do I learn Java?") is None
    assert differing_clauses(f"{CONTEXT} Why?", f"{CONTEXT}  Why?") is None  # spacing only
    assert differing_clauses("What is the capital of France and why", "Where is Lyon") is None
    one = "what is the capital of France and why is it so famous today"
    assert differing_clauses(one, one.replace("France", "Spain")) is None  # one clause


def test_operators_of_code_are_words_that_count() -> None:
    for a, b in [("a && b", "a || b"), ("x += 1", "x -= 1"), ("x << 2", "x >> 2")]:
        assert _text(f"What does {a} do?").operators != _text(f"What does {b} do?").operators
    assert _text("see https://example.com/a and more").operators == ()


def test_the_asked_turns_name_keys_the_namespace() -> None:
    def ns(**fields: str) -> str:
        return namespace_for("t", "a", [{"role": "user", "content": "Who am I?", **fields}])

    assert ns(name="alice") != ns(name="bob") != ns()
    assert ns() == namespace_for("t", "a", [{"role": "user", "content": "Other text"}])


def test_a_short_text_of_many_tokens_is_refused_not_cut() -> None:
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    async def run() -> tuple[bool, str, str]:
        cache = SemanticCache(SemanticSettings())
        await cache.start()
        try:
            # Hangul: under 256 characters, over 256 tokens (each syllable splits into jamo).
            base = "한국어 문장은 토큰이 많습니다 " * 14
            assert len(base) < 254 and cache.worker.embedder.count_tokens(base) > 256
            stored = await cache.store("ns", base + "첫째", b"one", wait_s=5)
            short = "짧은 질문입니다"
            await cache.store("ns", short, b"two", wait_s=5)
            asked = await cache.lookup("ns", base + "둘째")
            return stored, asked.outcome, asked.reason or ""
        finally:
            await cache.aclose()

    stored, outcome, reason = asyncio.run(run())
    assert not stored and (outcome, reason) == ("skipped", "too_long")


def test_a_line_break_ends_a_clause() -> None:
    """A bulleted context with no punctuation, then the question on its own line."""
    sheet = (
        "Product sheet\n- model X200 router\n- WPA3 supported\n- four LAN ports\n- guest network\n"
    )
    assert differing_clauses(
        sheet + "How many LAN ports does it have?", sheet + "Is there a guest network?"
    ) == (
        "How many LAN ports does it have?",
        "Is there a guest network?",
    )


def test_clauses_are_embedded_once_outside_the_index_lock() -> None:
    """A lookup whose candidates share a context with it embeds the clauses they differ in after
    the search, with the index lock free (embedding them under it had serialised every lookup
    of every worker: hits/s fell threefold in a namespace of such texts); a clause one text lacks
    altogether is no question at all (nothing embedded for it); the verdicts are unchanged."""
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    tail = " I tried the settings menu and the help pages but nothing worked so far?"
    short = "How do I reset my photos on my iPhone safely?"

    async def run() -> tuple[list[str], list[int], list[bool]]:
        cache = SemanticCache(SemanticSettings(vector_memo=0, context_groups=False))
        await cache.start()
        free: list[bool] = []  # the index lock was free at each model call
        embed = cache.worker._embed

        def watched(texts: list[str], embedder: object, lone: bool = True) -> object:
            free.append(not cache.worker._state.locked())
            return embed(texts, embedder, lone)  # type: ignore[arg-type]

        cache.worker._embed = watched  # type: ignore[method-assign,assignment]
        try:
            for text in (
                short,
                short + tail,
                "How do I back up my photos on my iPhone safely?" + tail,
            ):
                assert await cache.store("ns", text, b"answer", wait_s=5)
            outcomes, embedded = [], []
            for asked in (
                short,
                short + tail,
                "How do I sync my photos on my iPhone safely?" + tail,
            ):
                before = cache.worker.embedded
                outcomes.append((await cache.lookup("ns", asked)).outcome)
                embedded.append(cache.worker.embedded - before)
            return outcomes, embedded, free
        finally:
            await cache.aclose()

    outcomes, embedded, free = asyncio.run(run())
    # Verbatim repeats are served; "sync" after the shared tail is not "back up" / "reset".
    assert outcomes == ["hit", "hit", "rejected"]
    assert embedded[0] == 1  # the short question against its long variant: no clause to embed
    assert embedded[2] >= 2 and free and all(free)


def test_a_texts_clauses_are_written_as_a_pair_differing_in_one_would_judge_them() -> None:
    asked = f"{CONTEXT} How do we speed up the test suite?"
    other = f"{CONTEXT} Which hosting provider is cheapest?"
    assert differing_clauses(asked, other)[0] in clauses(asked)  # type: ignore[index]
    sheet = "Product sheet\n- model X200 router\n- four LAN ports\nIs there a guest network?"
    assert clauses(sheet) == [
        "Product sheet",
        "- model X200 router",
        "- four LAN ports",
        "Is there a guest network?",
    ]
    # One clause, or too few words to share a dominant context: nothing to judge apart.
    assert clauses("How do I speed up the test suite of our Django app?") == []
    assert clauses("Why? Because.") == []


def test_an_idle_thread_embeds_the_questions_clauses_beside_it() -> None:
    """A question of several clauses: while one thread embeds it, an idle one embeds its
    clauses (in a call of their own), so a candidate sharing its context is judged without
    embedding after the search (a ~35-token paraphrase in one client: the clause had been a
    second model call after the first); a long text warms its last few clauses only."""
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    stored = f"{CONTEXT} How do we speed up the test suite?"
    asked = f"{CONTEXT} How can we make the test suite faster?"

    async def run() -> tuple[str, list[tuple[str, list[str]]], int]:
        cache = SemanticCache(SemanticSettings(workers=2, context_groups=False))
        await cache.start()
        calls: list[tuple[str, list[str]]] = []
        embed = cache.worker._embed

        def watched(texts: list[str], embedder: object, lone: bool = True) -> object:
            fresh = [t for t in texts if not cache.worker.remembers(t)]
            calls.append((threading.current_thread().name, fresh))
            return embed(texts, embedder, lone)  # type: ignore[arg-type]

        try:
            assert await cache.store("ns", stored, b"answer", wait_s=5)
            assert await cache.worker.embed(clauses(stored)) is not None
            await threads_idle(cache.worker, 2)
            cache.worker._embed = watched  # type: ignore[method-assign,assignment]
            found = await cache.lookup("ns", asked)
            warmed, first = cache.worker.warmed, list(calls)
            # A long text: only its last few clauses are embedded ahead.
            await threads_idle(cache.worker, 2)
            many = " ".join(f"Step {i} of the runbook is done." for i in range(10))
            await cache.lookup("ns", many + " What comes next?")
            assert 0 < cache.worker.warmed - warmed <= 4
            return found.outcome, first, warmed
        finally:
            await cache.aclose()

    outcome, calls, warmed = asyncio.run(run())
    assert outcome == "hit"
    question = [thread for thread, texts in calls if texts == [asked]]
    ahead = [thread for thread, texts in calls if "How can we make the test suite faster?" in texts]
    # Two model calls, never one batch: the clause's may run on the other thread beside the
    # question's, or first on the same one when the other is slow to wake (as the scheduler
    # has it; timing is the benchmark's business).
    assert warmed >= 1 and len(question) == 1 and len(ahead) == 1, calls
    # After the search the clause came from the memo: nothing was embedded again (the shared
    # context's clauses were remembered from the stored text's).
    assert sum(len(texts) for _, texts in calls) == 2, calls


def test_a_stored_texts_clauses_are_embedded_ahead_while_threads_idle() -> None:
    """Storing a text of several clauses, with two threads idle, embeds its clauses into the
    memo: a later question sharing its context is judged on them without a model call after
    its search (a long rewording's hit in one client: ~3 ms of its ~11 were that call)."""
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    stored = f"{CONTEXT} How do we speed up the test suite?"
    asked = f"{CONTEXT} How can we make the test suite faster?"

    async def run() -> tuple[bool, str, int]:
        cache = SemanticCache(SemanticSettings(workers=2, context_groups=False))
        await cache.start()
        try:
            await threads_idle(cache.worker, 2)
            assert await cache.store("ns", stored, b"answer", wait_s=5)
            await threads_idle(cache.worker, 2)
            remembered = all(cache.worker.remembers(t) for t in clauses(stored))
            before = cache.worker.embedded
            found = await cache.lookup("ns", asked)
            await threads_idle(cache.worker, 2)
            # the question and its own clause: nothing of the stored side's
            return remembered, found.outcome, cache.worker.embedded - before
        finally:
            await cache.aclose()

    remembered, outcome, embedded = asyncio.run(run())
    assert remembered and outcome == "hit" and embedded == 2


def test_every_candidate_is_judged_in_one_walk_of_the_trees() -> None:
    """Candidates judged by their clauses and those judged whole go to the verifier together,
    after the clauses are embedded: one walk of the trees a lookup, not one a candidate."""
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    stored = [
        f"{CONTEXT} How do we speed up the test suite?",
        f"{CONTEXT} How do we shorten the build?",
        "How do we deploy Django?",
    ]

    async def run() -> tuple[str, list[list[str]]]:
        # every entry a candidate: no threshold, no margin below the closest
        cache = SemanticCache(SemanticSettings(vector_memo=0, judge_margin=1.0))
        await cache.start()
        try:
            for text in stored:
                assert await cache.store("ns", text, text.encode(), wait_s=5)
            with trees_watched(cache) as calls:
                asked = f"{CONTEXT} How can we make the test suite faster?"
                found = await cache.lookup("ns", asked, threshold=-1.0)
            assert found.hit is not None
            return found.hit.question, calls
        finally:
            await cache.aclose()

    served, calls = asyncio.run(run())
    assert served == stored[0]
    assert len(calls) == 1, calls
    # "How do we shorten the build?" is below the retrieval floor against the asked clause:
    # never walked.
    assert sorted(calls[0]) == sorted(["How do we speed up the test suite?", stored[2]]), calls


def test_pairs_judged_by_their_clauses_are_not_judged_whole() -> None:
    """A candidate sharing a dominant context with the question is judged on the clauses they
    differ in alone: the trees run only on the other candidates' whole texts (on long texts the
    whole-text features were most of the search's time, and their verdict was thrown away)."""
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    async def run() -> tuple[list[str], list[list[str]]]:
        cache = SemanticCache(SemanticSettings(vector_memo=0))
        await cache.start()
        try:
            stored = (f"{CONTEXT} How do we speed up the test suite?", "How do we deploy Django?")
            for text in stored:
                assert await cache.store("ns", text, b"answer", wait_s=5)
            outcomes = []
            with trees_watched(cache) as judged_whole:
                for asked in (
                    f"{CONTEXT} How can we make the test suite faster?",
                    f"{CONTEXT} Which hosting provider is cheapest?",
                ):
                    outcomes.append((await cache.lookup("ns", asked)).outcome)
            return outcomes, judged_whole
        finally:
            await cache.aclose()

    outcomes, judged_whole = asyncio.run(run())
    assert outcomes[0] == "hit" and outcomes[1] != "hit"
    whole = [text for call in judged_whole for text in call]
    # The clauses were judged (by the same trees), the whole long texts never.
    assert "How do we speed up the test suite?" in whole, judged_whole
    assert whole and all(not text.startswith(CONTEXT) for text in whole), judged_whole


@pytest.mark.parametrize("matcher", ["verifier", "guards"])
def test_a_question_asked_again_verbatim_is_served_without_judging(matcher: str) -> None:
    """The closest candidate is the question itself: it is served, without running the trees
    on the other candidates or embedding the clauses of those sharing its context (a ~35-token
    repeat took 26 ms with the vector memo off, 8 ms now). The guards matcher serves it too:
    its entity guard refused "Is QVC's Lisa Robertson still on air?" against itself."""
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_settings import SemanticSettings

    tail = " I tried the settings menu and the help pages but nothing worked so far?"
    texts = [
        "How do I reset my photos on my iPhone safely?" + tail,
        "How do I back up my photos on my iPhone safely?" + tail,
        "How do I sync my photos on my iPhone safely?" + tail,
        "Is QVC's Lisa Robertson still on air?",
    ]

    async def run() -> tuple[list[tuple[str, str | None]], list[int], int]:
        cache = SemanticCache(SemanticSettings(vector_memo=0, matcher=matcher))  # type: ignore[arg-type]
        await cache.start()
        try:
            for text in texts:
                assert await cache.store("ns", text, text.encode(), wait_s=5)
            served, embedded = [], []
            with trees_watched(cache) as judged:
                for text in texts:
                    before = cache.worker.embedded
                    found = await cache.lookup("ns", text)
                    hit = found.hit.response.decode() if found.hit else None
                    served.append((found.outcome, hit))
                    embedded.append(cache.worker.embedded - before)
            return served, embedded, len(judged)
        finally:
            await cache.aclose()

    served, embedded, judged = asyncio.run(run())
    assert served == [("hit", text) for text in texts]
    # The verifier's namespace has groups of shared context: a repeat of several clauses is
    # found by its id there, before anything is embedded (`test_context_groups`); one of a
    # single clause takes the whole-text search.
    assert embedded == ([0, 0, 0, 1] if matcher == "verifier" else [1, 1, 1, 1]) and judged == 0


def test_a_text_of_one_clause_is_told_without_working_its_clauses_out() -> None:
    """`has_clauses` (one regex scan, before a lookup) is False only for texts `clauses` finds
    one clause in: over every written question and edge cases of punctuation and line breaks."""
    from pathlib import Path

    from gateway.cache.shared_context import has_clauses

    texts = [
        cell
        for path in sorted(Path("loadtests/data/written").glob("*.tsv"))
        for line in path.read_text().splitlines()
        for cell in line.split("\t")
    ]
    texts += [
        "Is it safe?",
        "How do I reset my photos on my iPhone safely? I tried the settings menu.",
        "Product sheet\n- model X200 router\n- four LAN ports\nIs there a guest network?",
        "A list (see the note.) and then six more words here",
        "one two three four five six seven.\n",
        "\nleading break, then one clause of many words here",
        "e.g. this one: it has a colon inside and more words",
    ]
    assert sum(has_clauses(t) for t in texts) >= 4
    assert all(has_clauses(t) for t in texts if clauses(t)), [
        t for t in texts if clauses(t) and not has_clauses(t)
    ]
