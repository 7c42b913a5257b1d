"""Cached questions grouped by the context they share word for word, to judge a long question by
its own clause without embedding the whole of it.

A message of several clauses ("<a page of a manual> Question: how long is the warranty?") whose
context is word for word that of a cached one is judged by the clause the two differ in
(`shared_context`). Finding that candidate took the whole message's embedding (a ~36-token
question costs twice its ~12-token clause, and the clause was embedded after it anyway) only to
retrieve what the words already say. So each cached text of several clauses joins two groups:
the texts equal to it but for their first clause, and those equal to it but for their last, each
group named by a hash of the clauses its members share and holding each member's own clause
vector. A new question hashes its clauses the same way; in a group it finds, it embeds its own
clause only, searches the members' clauses and has the nearest judged (`SemanticCache`).

A hash names a group, it proves nothing: every candidate is checked again word for word
(`differing_clauses`) before it is judged. Entries loaded from Redis join no group (their clause
vectors are not stored there): the whole-text search still finds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.cache.shared_context import MIN_SHARED_WORDS
from gateway.cache.vector_rows import ROWS_OVERHEAD, VectorRows

#: Bookkeeping per membership beyond its vector row: the (key, id) row slot, the group's id
#: list slot, the entry's key tuple (measured with tracemalloc, rounded up).
MEMBER_OVERHEAD = 360


def context_keys(namespace: str, parts: Sequence[str]) -> list[tuple[int, int]]:
    """(clause position, group key) for a text of the clauses `parts` (`shared_context.clauses`)
    in `namespace`: its first clause and its last, each against the rest of the text as the
    shared context; none for a context of fewer than `MIN_SHARED_WORDS` words, which never
    dominates. Keys are `hash()`es: stable within the process that holds the index."""
    n = len(parts)
    if n < 2:
        return []
    out = []
    for i in (0, n - 1):
        rest = (*parts[:i], *parts[i + 1 :])
        if sum(len(p.split()) for p in rest) >= MIN_SHARED_WORDS:
            out.append((i, hash((namespace, i, rest))))
    return out


def membership_bytes(count: int, dim: int) -> int:
    """The most `count` memberships can add: a new group each, its matrix at two rows."""
    return count * (2 * 4 * dim + 8 + ROWS_OVERHEAD + MEMBER_OVERHEAD)


class ContextIndex:
    """Groups of entries by shared context, each a matrix of its members' own clause vectors.
    Owned by `SemanticIndex` (same thread, same bounds): every byte is in `nbytes`."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._groups: dict[int, VectorRows] = {}
        self._rows: dict[tuple[int, str], int] = {}
        self._keys: dict[str, tuple[int, ...]] = {}  # entry id -> the groups it is in
        self._namespaces: dict[str, int] = {}  # memberships per namespace
        self.nbytes = 0

    def __len__(self) -> int:
        """Memberships."""
        return len(self._rows)

    def has_namespace(self, namespace: str) -> bool:
        """Whether an entry of `namespace` is in a group (a hint from another thread, like
        `SemanticIndex.has_namespace`)."""
        return namespace in self._namespaces

    def grouped(self, entry_id: str) -> bool:
        """Whether the entry is in a group (a hint from another thread)."""
        return entry_id in self._keys

    def has(self, key: int) -> bool:
        return key in self._groups

    def add(self, entry_id: str, namespace: str, members: Sequence[tuple[int, np.ndarray]]) -> None:
        """Put `entry_id` in the group of each (key, its own clause's vector) of `members`."""
        if not members or entry_id in self._keys:
            return
        for key, vector in members:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = VectorRows(self.dim)
                self.nbytes += group.nbytes
            before = group.nbytes
            self._rows[(key, entry_id)] = group.add(entry_id, vector)
            self.nbytes += group.nbytes - before + MEMBER_OVERHEAD
        self._keys[entry_id] = tuple(key for key, _ in members)
        self._namespaces[namespace] = self._namespaces.get(namespace, 0) + len(members)

    def remove(self, entry_id: str, namespace: str) -> None:
        keys = self._keys.pop(entry_id, ())
        for key in keys:
            group = self._groups[key]
            before = group.nbytes
            row = self._rows.pop((key, entry_id))
            moved = group.remove(row)
            if moved is not None:
                self._rows[(key, moved)] = row
            if group.n == 0:
                del self._groups[key]
                self.nbytes -= before
            else:
                self.nbytes -= before - group.nbytes
            self.nbytes -= MEMBER_OVERHEAD
        if keys:
            left = self._namespaces[namespace] - len(keys)
            if left:
                self._namespaces[namespace] = left
            else:
                del self._namespaces[namespace]

    def search(self, key: int, vector: np.ndarray, k: int) -> list[tuple[float, str]]:
        """Up to k members of the group `key`, by their clause's similarity to `vector`."""
        group = self._groups.get(key)
        if group is None:
            return []
        sims, rows = group.search(vector, k)
        return [
            (float(sim), group.ids[row]) for sim, row in zip(sims, rows, strict=True) if row >= 0
        ]
