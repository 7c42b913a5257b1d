"""Vectors kept in one contiguous float32 matrix that FAISS searches exactly (`faiss.knn`, inner
product = cosine on unit vectors).

Owning the matrix instead of using an `IndexIDMap(IndexFlatIP)` makes a delete an O(dim) swap with
the last row, where `remove_ids` rewrites the whole index: TTL expiry and LRU eviction happen on
every insert once the cache is full, so deletes must be cheap.
"""

from __future__ import annotations

import threading

import faiss
import numpy as np

#: Fixed cost of a matrix: its owner's dict slot and key, the object, its id list, array header.
ROWS_OVERHEAD = 480

_local = threading.local()


def _one_omp_thread() -> None:
    """OpenMP's thread count is per calling thread: set it on the thread that searches.

    A single exact k=1 search gains little from more threads, and with the other cores busy
    serving requests, extra OpenMP threads double the latency instead.
    """
    if not getattr(_local, "omp_set", False):
        faiss.omp_set_num_threads(1)
        _local.omp_set = True


class VectorRows:
    """A contiguous matrix of vectors, rows 0..n-1 live, ids[i] owns row i: FAISS searches it
    exactly, a delete is an O(dim) swap with the last row, and the matrix starts at one row and
    doubles (most namespaces hold one entry)."""

    __slots__ = ("ids", "n", "vecs")

    def __init__(self, dim: int) -> None:
        self.vecs = np.empty((1, dim), dtype=np.float32)
        self.ids: list[str] = []
        self.n = 0

    @property
    def nbytes(self) -> int:
        return self.vecs.nbytes + 8 * len(self.ids) + ROWS_OVERHEAD

    def add(self, entry_id: str, vector: np.ndarray) -> int:
        if self.n == len(self.vecs):
            grown = np.empty((len(self.vecs) * 2, self.vecs.shape[1]), dtype=np.float32)
            grown[: self.n] = self.vecs[: self.n]
            self.vecs = grown
        self.vecs[self.n] = vector
        self.ids.append(entry_id)
        self.n += 1
        return self.n - 1

    def remove(self, row: int) -> str | None:
        """Delete a row by moving the last row into it; returns the id that moved, if any."""
        last = self.n - 1
        moved = None
        if row != last:
            self.vecs[row] = self.vecs[last]
            self.ids[row] = self.ids[last]
            moved = self.ids[row]
        self.ids.pop()
        self.n = last
        if len(self.vecs) > 1 and self.n <= len(self.vecs) // 4:
            self.vecs = self.vecs[: len(self.vecs) // 2].copy()  # give memory back
        return moved

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        _one_omp_thread()
        k = min(k, self.n)
        sims, rows = faiss.knn(
            vector.reshape(1, -1), self.vecs[: self.n], k, metric=faiss.METRIC_INNER_PRODUCT
        )
        return sims[0], rows[0]
