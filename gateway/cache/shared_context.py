"""The clauses in which two long texts differ, when most of their words are the same.

A chat message often carries context and then a question ("Here is my router's manual: ...
Question: how long is the warranty?"). Two such messages share most of their words, so their
embeddings and lexical overlap say "the same" whatever the questions are: the verifier alone
served "How long is the warranty?" the answer cached for "Does it support WPA3?" after the same
manual. When the shared words dominate, `SemanticCache` judges the clauses that differ instead of
the whole texts: with the context the same word for word, they are the question.
"""

from __future__ import annotations

import re

#: The shared words must be at least this many, and this share of the shorter text, for the
#: context to dominate; shorter texts ("How do I learn Python?" / "... Java?") are the
#: verifier's own business.
MIN_SHARED_WORDS = 6
MIN_SHARED_SHARE = 0.5
# A word that ends a clause: what follows it starts a new one. A line break ends one too (a
# bulleted list, a question on its own line after a block of context).
_CLAUSE_END = re.compile(r"[.?!;:]['\")\]]*$|^\n$")
# Words, and each line break as a word of its own (str.split() would drop them).
_WORDS = re.compile(r"[^\s]+|\n")


def _clause_start(words: list[str], at: int) -> int:
    """The index of the first word of the clause holding words[at]."""
    while at > 0 and not _CLAUSE_END.search(words[at - 1]):
        at -= 1
    return at


def _clause_end(words: list[str], at: int) -> int:
    """One past the last word of the clause holding words[at - 1] (at itself when at is 0)."""
    while at < len(words) and (at == 0 or not _CLAUSE_END.search(words[at - 1])):
        at += 1
    return at


def differing_clauses(a: str, b: str) -> tuple[str, str] | None:
    """The clauses of `a` and `b` that hold their differences, when the two share a dominant
    context (a common start and end of at least `MIN_SHARED_WORDS` words, half the shorter
    text); None otherwise, or when the difference spans every clause (nothing to narrow)."""
    wa, wb = _WORDS.findall(a), _WORDS.findall(b)
    shortest = min(len(wa), len(wb))
    if shortest < MIN_SHARED_WORDS:
        return None
    p = 0
    while p < shortest and wa[p] == wb[p]:
        p += 1
    if p == len(wa) == len(wb):
        return None  # the same words: nothing differs but spacing
    s = 0
    while s < shortest - p and wa[-1 - s] == wb[-1 - s]:
        s += 1
    shared = p + s
    if shared < MIN_SHARED_WORDS or shared < MIN_SHARED_SHARE * shortest:
        return None
    ends = []
    for words in (wa, wb):
        start = _clause_start(words, p)
        end = _clause_end(words, max(len(words) - s, start + 1))
        ends.append((start, end, words))
    if all(start == 0 and end == len(words) for start, end, words in ends):
        return None  # one clause each: the pair itself is what the verifier already judged
    (sa, ea, _), (sb, eb, _) = ends
    return _text(wa[sa:ea]), _text(wb[sb:eb])


# A clause ending before the text does: what `clauses` splits at, found by one scan in C.
_INNER_END = re.compile(r"[.?!;:]['\")\]]*\s+\S|\n\s*\S")


def has_clauses(text: str) -> bool:
    """False when `text` is one clause (then `clauses` gives nothing): a microsecond's check
    before a lookup, where working the clauses out on the event loop cost 6-15% of the hits/s
    of verbatim repeats. True may still be one clause of too few words."""
    return _INNER_END.search(text) is not None


def clauses(text: str) -> list[str]:
    """Each clause of `text` as `differing_clauses` writes it, when the text has several and
    enough words to share a dominant context: what a pair differing in one clause would judge
    of this side (empty otherwise)."""
    words = _WORDS.findall(text)
    if len(words) < MIN_SHARED_WORDS:
        return []
    out, start = [], 0
    for i, word in enumerate(words):
        if _CLAUSE_END.search(word) or i == len(words) - 1:
            clause = _text(words[start : i + 1])
            if clause:
                out.append(clause)
            start = i + 1
    return out if len(out) > 1 else []


def _text(words: list[str]) -> str:
    return " ".join(w for w in words if w != "\n")
