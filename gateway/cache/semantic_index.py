"""In-memory vector index of the semantic cache: namespaces, TTL and memory bounds.

Not thread-safe on purpose: one thread (the embedding worker) owns it, so searches never race
with inserts or evictions and no lock sits on the request path.

Each namespace keeps its vectors in one contiguous matrix (`vector_rows`): TTL expiry and LRU
eviction happen on every insert once the cache is full, so deletes must be cheap.

Every byte is counted against `max_bytes`: entries (text, response, bookkeeping), each
namespace's matrix at its allocated capacity plus its fixed cost, the groups of shared context
(`context_index`) and the word gate's fixed table. Most namespaces hold one entry (every
conversation context is its own namespace), so a matrix starts at one row and doubles; a
namespace disappears with its last entry, and cold namespaces empty through LRU eviction.
"""

from __future__ import annotations

import heapq
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gateway.cache.context_index import ContextIndex, membership_bytes
from gateway.cache.vector_rows import ROWS_OVERHEAD, VectorRows
from gateway.cache.word_gate import WordGate, slots_for
from gateway.infra.malloc import trim

#: Bookkeeping per entry beyond text and response: the Entry object, its id string, its slots in
#: the LRU dict, the row dict and the expiry heap (measured with tracemalloc, rounded up), plus
#: what the C allocator keeps per entry under eviction churn, trims included (RSS 4.1 KB per
#: entry against 3.5 KB counted without it: loadtests/semantic_memory.py --max-mb 64).
_ENTRY_OVERHEAD = 640 + 700
#: Removals between two trims of the C allocator's free memory (`gateway.infra.malloc`).
_TRIM_EVERY = 4096
_NO_VECTOR = np.zeros(0, dtype=np.float32)


@dataclass(slots=True)
class Entry:
    """One cached answer: the question it answered and where it may be served."""

    entry_id: str
    namespace: str
    text: str
    vector: np.ndarray  # (dim,) float32, unit norm; empty once in the index (the matrix has it)
    response: bytes
    expires_at: float  # wall-clock seconds, shared between replicas

    @property
    def nbytes(self) -> int:
        """Memory of the entry itself; its vector row is counted with its namespace."""
        return (
            sys.getsizeof(self.text)
            + sys.getsizeof(self.namespace)
            + sys.getsizeof(self.response)
            + self.vector.nbytes
            + _ENTRY_OVERHEAD
        )


class SemanticIndex:
    """Entries by namespace, bounded by count and bytes (least recently used go first)."""

    def __init__(self, dim: int, max_entries: int, max_bytes: int) -> None:
        self.dim = dim
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # LRU order, oldest first
        self._rows: dict[str, int] = {}
        self._spaces: dict[str, VectorRows] = {}
        self._expiry: list[tuple[float, str]] = []
        # Fixed size, counted once: which namespaces hold which content words (`unrelated`).
        self.words = WordGate(slots_for(max_entries, max_bytes))
        self.contexts = ContextIndex(dim)
        self.nbytes = self.words.nbytes
        self._removed = 0
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._entries

    @property
    def namespaces(self) -> int:
        return len(self._spaces)

    def has_namespace(self, namespace: str) -> bool:
        """Whether the namespace holds entries. Safe to call from another thread: a dict lookup
        is atomic, and a stale answer only turns one lookup into a miss or an empty search."""
        return namespace in self._spaces

    def entries_of(self, namespace: str, most: int) -> list[Entry]:
        """The namespace's entries when it holds at most `most` of them, else []."""
        space = self._spaces.get(namespace)
        if space is None or space.n > most:
            return []
        return [self._entries[i] for i in space.ids]

    def unrelated(self, namespace: str, text: str) -> bool:
        """Whether the namespace holds entries, none of which shares a content word with `text`
        (`WordGate`; safe from another thread like `has_namespace`)."""
        return namespace in self._spaces and self.words.unrelated(namespace, text)

    @property
    def index_bytes(self) -> int:
        """Bytes held by the vector matrices (allocated capacity, not only live rows)."""
        return sum(s.vecs.nbytes for s in self._spaces.values())

    def add(self, entry: Entry, now: float) -> bool:
        """Insert or replace an entry, then enforce TTL and the memory bounds.

        False when refused: expired already, a vector of another size, or bigger on its own than
        the whole bound.
        """
        if entry.expires_at <= now or entry.vector.shape != (self.dim,):
            return False
        # The matrix row is the only copy kept of the vector (the caller's entry keeps its own).
        stored = Entry(
            entry.entry_id, entry.namespace, entry.text, _NO_VECTOR, entry.response,
            entry.expires_at,
        )  # fmt: skip
        alone = stored.nbytes + ROWS_OVERHEAD + 4 * self.dim * 2 + self.words.nbytes
        if alone + membership_bytes(2, self.dim) > self.max_bytes:
            return False  # nor could it join its groups
        if entry.entry_id in self._entries:
            self.remove(entry.entry_id)
        space = self._spaces.get(entry.namespace)
        if space is None:
            space = self._spaces[entry.namespace] = VectorRows(self.dim)
            self.nbytes += space.nbytes
        before = space.nbytes
        self._rows[entry.entry_id] = space.add(entry.entry_id, entry.vector)
        self.nbytes += space.nbytes - before
        self._entries[entry.entry_id] = stored
        self.nbytes += stored.nbytes
        self.words.add(entry.namespace, entry.text)
        heapq.heappush(self._expiry, (entry.expires_at, entry.entry_id))
        self.expire(now)
        self._bound()
        return entry.entry_id in self._entries

    def join(self, groups: Mapping[str, Sequence[tuple[int, np.ndarray]]]) -> None:
        """Put entries in groups of shared context: by entry id, (group key, the entry's own
        clause's vector) for each group it joins (`context_index`); then enforce the bounds.
        An entry gone meanwhile, or a vector of another size, joins nothing."""
        before = self.contexts.nbytes
        for entry_id, joined in groups.items():
            entry = self._entries.get(entry_id)
            if entry is not None and all(v.shape == (self.dim,) for _, v in joined):
                self.contexts.add(entry_id, entry.namespace, joined)
        self.nbytes += self.contexts.nbytes - before
        self._bound()

    def _bound(self) -> None:
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            self.remove(next(iter(self._entries)))
            self.evicted += 1

    def remove(self, entry_id: str) -> bool:
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            return False
        space = self._spaces[entry.namespace]
        before = space.nbytes
        row = self._rows.pop(entry_id)
        moved = space.remove(row)
        if moved is not None:
            self._rows[moved] = row
        if space.n == 0:
            del self._spaces[entry.namespace]  # an empty namespace costs nothing
            self.nbytes -= before
        else:
            self.nbytes -= before - space.nbytes
        self.nbytes -= entry.nbytes
        self.words.remove(entry.namespace, entry.text)
        before = self.contexts.nbytes
        self.contexts.remove(entry_id, entry.namespace)
        self.nbytes -= before - self.contexts.nbytes
        self._removed += 1
        if self._removed % _TRIM_EVERY == 0:
            trim()  # churn leaves freed pages in the allocator: give them back
        return True

    def expire(self, now: float) -> int:
        """Drop entries whose TTL has passed; stale heap items of replaced entries are skipped."""
        count = 0
        heap = self._expiry
        while heap and heap[0][0] <= now:
            expires_at, entry_id = heapq.heappop(heap)
            entry = self._entries.get(entry_id)
            if entry is not None and entry.expires_at == expires_at:
                self.remove(entry_id)
                count += 1
        if len(heap) > 2 * len(self._entries) + 1024:  # replaced/evicted ids pile up otherwise
            heap[:] = [(e.expires_at, e.entry_id) for e in self._entries.values()]
            heapq.heapify(heap)
        self.expired += count
        return count

    def search(
        self, namespace: str, vector: np.ndarray, k: int, now: float
    ) -> list[tuple[float, Entry]]:
        """Up to k live entries of the namespace, most similar first."""
        self.expire(now)
        space = self._spaces.get(namespace)
        if space is None:
            return []
        sims, rows = space.search(vector, k)
        return [
            (float(sim), self._entries[space.ids[row]])
            for sim, row in zip(sims, rows, strict=True)
            if row >= 0
        ]

    def get(self, entry_id: str, now: float) -> Entry | None:
        """The live entry of that id, if any."""
        entry = self._entries.get(entry_id)
        return entry if entry is not None and entry.expires_at > now else None

    def search_context(
        self, key: int, vector: np.ndarray, k: int, now: float
    ) -> list[tuple[float, Entry]]:
        """Up to k live members of the group of shared context `key`, by the similarity of
        their own clause to `vector`."""
        self.expire(now)
        return [(sim, self._entries[i]) for sim, i in self.contexts.search(key, vector, k)]

    def touch(self, entry_id: str) -> None:
        """Mark an entry as just used (LRU)."""
        if entry_id in self._entries:
            self._entries.move_to_end(entry_id)
