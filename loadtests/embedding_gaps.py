"""What one embedding costs after the process was idle, and with one ONNX session or two.

    python -m loadtests.embedding_gaps [--texts 100] [--gaps 0,0.5,2,5,10,30]

A lone request (one client) reaches the embedder after a pause: the client's own work, the
upstream call, the previous answer. This measures the int8 embedder's time for one paraphrase
of the throughput benchmark's questions (~15 and ~36 tokens) after a pause of each length,
spent asleep (the thread idle) or spinning (the core busy, touching almost no memory). Then
two worker threads taking turns, each with its own session or both with one shared session
(`make_embedders`), with a 3 ms pause between texts; and both threads embedding at once
(texts a second). Medians. In-process, no gateway; stops by itself.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from collections.abc import Sequence

from gateway.cache.embedder import Embedder, OnnxEmbedder
from loadtests.semantic_throughput import paraphrases, questions


def _pause(seconds: float, spin: bool) -> None:
    if not spin:
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def after_gaps(emb: Embedder, texts: list[str], gap_ms: float, spin: bool) -> float:
    """Median ms of one embedding after each pause."""
    took = []
    for text in texts:
        _pause(gap_ms / 1000, spin)
        t = time.perf_counter()
        emb.embed([text])
        took.append(time.perf_counter() - t)
    return statistics.median(took) * 1000


def taking_turns(embedders: Sequence[Embedder], texts: list[str]) -> float:
    """Median ms of one embedding when worker threads take turns, 3 ms apart."""
    jobs: list[queue.Queue[str | None]] = [queue.Queue() for _ in embedders]
    took: queue.Queue[float] = queue.Queue()

    def worker(emb: Embedder, inbox: queue.Queue[str | None]) -> None:
        while (text := inbox.get()) is not None:
            t = time.perf_counter()
            emb.embed([text])
            took.put(time.perf_counter() - t)

    threads = [
        threading.Thread(target=worker, args=(e, q)) for e, q in zip(embedders, jobs, strict=True)
    ]
    for t in threads:
        t.start()
    times = []
    for i, text in enumerate(texts):
        time.sleep(0.003)
        jobs[i % len(jobs)].put(text)
        times.append(took.get())
    for q in jobs:
        q.put(None)
    for t in threads:
        t.join()
    return statistics.median(times) * 1000


def at_once(embedders: Sequence[Embedder], texts: list[str]) -> float:
    """Texts a second with every thread embedding its share at once."""

    def run(emb: Embedder, part: list[str]) -> None:
        for text in part:
            emb.embed([text])

    n = len(embedders)
    threads = [threading.Thread(target=run, args=(e, texts[i::n])) for i, e in enumerate(embedders)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return len(texts) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=100)
    ap.add_argument("--gaps", default="0,0.5,2,5,10,30", help="pauses before each text, ms")
    args = ap.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    one, other = OnnxEmbedder(), OnnxEmbedder()
    print("| questions | pause ms | asleep: one embedding ms | spinning: one embedding ms |")
    print("|---|---|---|---|")
    sets = {}
    for length in ("short", "long"):
        texts = paraphrases(questions(64, length == "long"), length == "long")[: args.texts]
        sets[length] = texts
        after_gaps(one, texts[:5], 0, False)  # load
        for gap in gaps:
            asleep = after_gaps(one, texts, gap, spin=False)
            spinning = after_gaps(one, texts, gap, spin=True)
            print(f"| {length} | {gap:g} | {asleep:.2f} | {spinning:.2f} |", flush=True)
    print(
        "\n| questions | sessions | two threads taking turns, 3 ms apart: ms | both at once: texts/s |"
    )
    print("|---|---|---|---|")
    for length, texts in sets.items():
        for label, pair in (("one shared", [one, one]), ("one each", [one, other])) * 2:
            turns = taking_turns(pair, texts)
            rate = at_once(pair, texts * 2)
            print(f"| {length} | {label} | {turns:.2f} | {rate:.0f} |", flush=True)


if __name__ == "__main__":
    main()
