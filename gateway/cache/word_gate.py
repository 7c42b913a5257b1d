"""Which cached contexts hold a question sharing a content word with a new one.

A question that shares no content word with any question cached in its context is almost never
served from the cache (a miss that would wait for its embedding): the cache stage then starts its
upstream call at once and races the lookup, instead of waiting for it. The gate only decides
whether to wait; the lookup still runs and still serves a hit that comes first, so a wrong guess
costs an upstream call (cancelled), never a wrong answer.

The gate is a counting hash table of (namespace, word stem) pairs: a fixed array of one-byte
counters, incremented when an entry enters the index and decremented when it leaves (a counter
that reached 255 stays there). A collision can only make two questions look related (the
request waits, as without the gate), never hide a shared word. Its memory is fixed at creation
and counted against the index's `max_bytes`.

Owned like the index: written by the embedding thread only; read from the event loop, where a
stale counter turns one request's guess, not its answer.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

#: Short, frequent words, and the verbs and fillers of any request ("tell me", "the best way"),
#: that say nothing of what a question is about: in a context holding many questions, they would
#: relate every new one to it.
STOPWORDS = frozenset(
    """a about all am an and any are as at be been being but by can could did do does doing for
    from had has have having he her here hers him his how i if in into is it its itself just me
    more most my no nor not of on once only or our ours out over own same she should so some such
    than that the their them then there these they this those through to too very was we were what
    when where which while who whom why will with would you your yours
    also anything better best describe difference does explain find get give good help know like
    list make many mean means much need new one please really show something still tell thing
    things use using want way ways well write""".split()  # noqa: SIM905
)
_WORD = re.compile(r"[a-z0-9]+")
#: Words are compared by their first letters: "encrypt", "encrypted" and "encryption" are one,
#: which can only make more questions look related (the safe side).
STEM_CHARS = 5
#: Counter slots per index entry (a question has ~5-10 content words: ~10% of slots in use when
#: the index is full), and the bounds on the table's size.
SLOTS_PER_ENTRY = 64
#: The stem a question the gate cannot judge is counted under (no word has it): any question may
#: be related to it.
_ANY = frozenset({"\x00"})
MIN_SLOTS = 1 << 10
MAX_SLOTS = 1 << 24


def stems(text: str) -> frozenset[str] | None:
    """The text's content-word stems; None when the gate cannot judge it (not ASCII: words are
    not separated by spaces in every script; or no content word at all)."""
    if not text.isascii():
        return None
    found = frozenset(w[:STEM_CHARS] for w in _WORD.findall(text.lower()) if w not in STOPWORDS)
    return found or None


def slots_for(max_entries: int, max_bytes: int) -> int:
    """A power of two: SLOTS_PER_ENTRY per entry, at most 1/16 of the byte bound."""
    want = min(max_entries * SLOTS_PER_ENTRY, max_bytes // 16, MAX_SLOTS)
    size = MIN_SLOTS
    while size * 2 <= want:
        size *= 2
    return size


class WordGate:
    __slots__ = ("_counts", "_mask")

    def __init__(self, slots: int) -> None:
        if slots <= 0 or slots & (slots - 1):
            raise ValueError("slots must be a power of two")
        self._counts = np.zeros(slots, dtype=np.uint8)
        self._mask = slots - 1

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes)

    def _slots(self, namespace: str, words: frozenset[str]) -> list[int]:
        # CRC-32, not hash(): Python salts str hashes per process, so which pairs collide (and
        # whether a request waits) would change with every start
        mask = self._mask
        seed = zlib.crc32(namespace.encode("utf-8", "surrogatepass") + b"\x00")
        return [zlib.crc32(w.encode(), seed) & mask for w in words]

    def add(self, namespace: str, text: str) -> None:
        counts = self._counts
        for i in self._slots(namespace, stems(text) or _ANY):
            if counts[i] < 255:
                counts[i] += 1

    def remove(self, namespace: str, text: str) -> None:
        counts = self._counts
        for i in self._slots(namespace, stems(text) or _ANY):
            if 0 < counts[i] < 255:  # a saturated counter no longer knows its count
                counts[i] -= 1

    def unrelated(self, namespace: str, text: str) -> bool:
        """True only when no question cached in `namespace` shares a content word with `text`
        (as far as the table knows: a collision answers False), and none of them is a question
        the gate cannot judge ("Who are you?": any question may be its paraphrase)."""
        words = stems(text)
        if words is None:
            return False
        counts = self._counts
        return not any(counts[i] for i in self._slots(namespace, words | _ANY))
