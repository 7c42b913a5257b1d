"""The word gate: which cached contexts hold a question sharing a content word with a new one."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.cache.word_gate import MAX_SLOTS, MIN_SLOTS, WordGate, slots_for, stems


def test_stems_drop_stopwords_and_cut_words() -> None:
    assert stems("How do I encrypt my Photos?") == {"encry", "photo"}
    assert stems("Encryption of photos") == {"encry", "photo"}
    assert stems("Who are you?") is None  # stopwords only: cannot judge
    assert stems("") is None
    assert stems("東京の天気は?") is None  # not ASCII: words are not space-separated
    assert stems("age < 30") == {"age", "30"}


def test_a_shared_word_makes_questions_related() -> None:
    gate = WordGate(1 << 12)
    gate.add("ns", "How do I reset my password?")
    assert not gate.unrelated("ns", "Can I reset it?")
    assert not gate.unrelated("ns", "Forgot PASSWORD")
    assert gate.unrelated("ns", "Which planets have rings?")
    assert gate.unrelated("other", "How do I reset my password?")  # another context
    assert not gate.unrelated("ns", "Who are you?")  # cannot judge: wait


def test_a_question_it_cannot_judge_relates_its_context_to_everything() -> None:
    gate = WordGate(1 << 12)
    gate.add("ns", "Who are you?")
    assert not gate.unrelated("ns", "What is your name?")
    gate.remove("ns", "Who are you?")
    assert gate.unrelated("ns", "What is your name?")


def test_removal_undoes_an_add_and_keeps_other_entries() -> None:
    gate = WordGate(1 << 12)
    gate.add("ns", "reset password")
    gate.add("ns", "change password")
    gate.remove("ns", "reset password")
    assert not gate.unrelated("ns", "my password")  # still held by the other entry
    assert gate.unrelated("ns", "reset router")
    gate.remove("ns", "change password")
    assert gate.unrelated("ns", "my password")
    gate.remove("ns", "change password")  # removing again never goes below zero
    assert not np.any(gate._counts)


def test_collisions_only_make_questions_related() -> None:
    gate = WordGate(MIN_SLOTS)  # a tiny table: many collisions
    for i in range(5000):
        gate.add("ns", f"q{i} t{i}")  # 10,000 stems in 1,024 slots
    # Every slot is taken or saturated: nothing looks unrelated, nothing shared is hidden.
    assert not gate.unrelated("ns", "q3 anything")
    assert not gate.unrelated("ns", "entirely different words")
    for i in range(5000):
        gate.remove("ns", f"q{i} t{i}")
    assert not np.any(gate._counts)  # no counter saturated: every removal undid its add
    for _ in range(300):
        gate.add("ns", "password")
    for _ in range(300):
        gate.remove("ns", "password")
    # A saturated counter no longer knows its count: it stays, still the safe side.
    assert not gate.unrelated("ns", "password")


def test_the_table_is_bounded() -> None:
    assert slots_for(100_000, 512 * 2**20) == 1 << 22
    assert slots_for(1, 10**9) == MIN_SLOTS
    assert slots_for(10**9, 10**12) == MAX_SLOTS
    assert slots_for(10**6, 2**20) * 16 <= 2**20  # at most a sixteenth of the byte bound
    with pytest.raises(ValueError):
        WordGate(1000)


def test_the_index_counts_the_table_and_answers_for_its_namespaces() -> None:
    from gateway.cache.semantic_index import Entry, SemanticIndex

    index = SemanticIndex(4, 100, 10**6)
    assert index.nbytes == index.words.nbytes > 0
    vec = np.array([1, 0, 0, 0], dtype=np.float32)
    assert not index.unrelated("ns", "Which planets have rings?")  # no such namespace
    index.add(Entry("e1", "ns", "How do I reset my password?", vec, b"a", 1e12), 0.0)
    assert index.unrelated("ns", "Which planets have rings?")
    assert not index.unrelated("ns", "password help")
    index.remove("e1")
    assert not index.unrelated("ns", "Which planets have rings?")  # gone with its namespace
    # Evicted entries leave the table as they leave the index.
    small = SemanticIndex(4, 1, 10**6)
    small.add(Entry("e1", "ns", "reset password", vec, b"a", 1e12), 0.0)
    small.add(Entry("e2", "ns", "planets rings", vec, b"b", 1e12), 0.0)
    assert small.evicted == 1 and small.unrelated("ns", "reset password")


def test_evictions_give_freed_memory_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every _TRIM_EVERY removals the C allocator's free pages are released (`malloc_trim`):
    under eviction churn RSS had grown 35% past the count."""
    import gateway.cache.semantic_index as si
    from gateway.infra.malloc import trim

    trim()  # callable here (glibc), a no-op elsewhere
    calls: list[int] = []
    monkeypatch.setattr(si, "trim", lambda: calls.append(1))
    monkeypatch.setattr(si, "_TRIM_EVERY", 10)
    index = si.SemanticIndex(4, 5, 10**6)
    vec = np.array([1, 0, 0, 0], dtype=np.float32)
    for i in range(35):
        index.add(si.Entry(f"e{i}", f"ns{i}", f"question {i}", vec, b"a", 1e12), 0.0)
    assert index.evicted == 30 and len(calls) == 3
