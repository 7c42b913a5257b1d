"""What judging costs, in-process: the verifier on a lookup's candidates.

    python -m loadtests.verifier_cost

Two cases, each the runtime's own `Verifier.pair_probabilities`: a new question of one template
("Unrelated question <id> about topic <n>?") against four stored ones of the same template, as
a miss among look-alike questions judges them (`semantic_throughput`'s miss); and a written
pair's second question, never seen, against its first (a paraphrase's hit judges one). The
stored texts are read once before (as a cache has read them). Prints each one's p50. To compare
two trees, run it on each, alternating.
"""

from __future__ import annotations

import statistics
import time
import uuid

from gateway.cache.verifier import default_verifier
from loadtests.verifier_data import load_written


def main() -> None:
    v = default_verifier()
    stored = [f"Unrelated question {uuid.uuid4().hex[:8]} about topic {i}?" for i in range(128)]
    written = load_written()[:2000]
    for s in stored:
        v.pair_probabilities([(s, stored[0], 0.9)])
    for p in written:
        v.pair_probabilities([(p.s1, p.s1, 0.9)])
    miss = []
    for i in range(1500):
        q = f"Unrelated question {uuid.uuid4().hex[:8]} about topic {1000 + i}?"
        t = time.perf_counter()
        v.pair_probabilities([(q, stored[(i + j) % 128], 0.9) for j in range(4)])
        miss.append(time.perf_counter() - t)
    hit = []
    for p in written:
        t = time.perf_counter()
        v.pair_probabilities([(p.s2, p.s1, 0.9)])
        hit.append(time.perf_counter() - t)
    print(
        f"a new template question against 4 look-alikes: p50 {1e3 * statistics.median(miss):.3f} ms; "
        f"a new written question against its pair: p50 {1e3 * statistics.median(hit):.3f} ms"
    )


if __name__ == "__main__":
    main()
