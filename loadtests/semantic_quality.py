"""Precision and recall of the semantic cache on labelled question pairs.

Protocol, per pair: store sentence1 in an empty namespace, look up sentence2, record hit or miss.
Precision = share of served hits that were true paraphrases; recall = share of paraphrase pairs
served from cache. Each pair runs once through the real `SemanticCache` (threshold 0, no guards)
to get its similarity; a hit at threshold t with guard set G is then `similarity >= t and
guards.check(...) is None` — exactly the cache's decision for a one-entry namespace — so every
threshold and guard combination is scored without re-embedding.

    python -m loadtests.semantic_quality [--paws 2000] [--embedder auto|torch|onnx]

Writes a markdown report and JSON next to each other (default loadtests/data/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.cache import guards
from gateway.cache.async_embedder import AsyncEmbedder
from gateway.cache.embedder import make_embedder
from gateway.cache.semantic import SemanticCache
from gateway.cache.semantic_settings import GuardSettings, SemanticSettings

DATA = Path(__file__).parent / "data"
PAWS = Path("/work/shared/data/paws_wiki/dev.tsv")
THRESHOLDS = [round(0.70 + 0.02 * i, 2) for i in range(15)]  # 0.70 .. 0.98
OFF = GuardSettings(numbers=False, negation=False, entities=False, entity_order=False)
GUARD_SETS: dict[str, GuardSettings] = {
    "none": OFF,
    "all": GuardSettings(),
    "numbers only": OFF.model_copy(update={"numbers": True}),
    "negation only": OFF.model_copy(update={"negation": True}),
    "entities only": OFF.model_copy(update={"entities": True}),
    "order only": OFF.model_copy(update={"entity_order": True}),
    "all but numbers": GuardSettings(numbers=False),
    "all but negation": GuardSettings(negation=False),
    "all but entities": GuardSettings(entities=False),
    "all but order": GuardSettings(entity_order=False),
}
TARGET_PRECISION = 0.98


@dataclass(slots=True)
class Pair:
    s1: str
    s2: str
    label: int
    kind: str
    similarity: float = 0.0


def load_chat() -> list[Pair]:
    with (DATA / "chat_pairs.tsv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Pair(r["sentence1"], r["sentence2"], int(r["label"]), r["kind"]) for r in rows]


def load_paws(n: int, seed: int = 0) -> list[Pair]:
    with PAWS.open(encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    rows = [r for r in rows if len(r) == 4 and r[3] in ("0", "1")]
    rows = random.Random(seed).sample(rows, min(n, len(rows)))
    return [Pair(r[1], r[2], int(r[3]), "paws") for r in rows]


async def measure_similarities(pairs: list[Pair], worker: AsyncEmbedder) -> None:
    """Run the store-then-lookup protocol through the cache, one fresh namespace per pair."""
    cache = SemanticCache(SemanticSettings(threshold=0.0, guards=OFF), worker=worker)
    for i, pair in enumerate(pairs):
        ns = f"quality\x1f{i}"
        await cache.store(ns, pair.s1, b"1")
        res = await cache.lookup(ns, pair.s2)
        pair.similarity = res.similarity if res.similarity is not None else -1.0


def score(pairs: list[Pair], threshold: float, gs: GuardSettings) -> dict[str, Any]:
    tp = fp = 0
    positives = sum(p.label for p in pairs)
    leaked: dict[str, int] = {}
    for p in pairs:
        if p.similarity >= threshold and guards.check(p.s2, p.s1, gs) is None:
            if p.label:
                tp += 1
            else:
                fp += 1
                leaked[p.kind] = leaked.get(p.kind, 0) + 1
    served = tp + fp
    return {
        "threshold": threshold,
        "precision": tp / served if served else 1.0,
        "recall": tp / positives if positives else 0.0,
        "served": served,
        "false_hits": fp,
        "false_hits_by_kind": leaked,
    }


def choose_threshold(pairs: list[Pair]) -> dict[str, Any]:
    """Highest recall with all guards at precision >= TARGET_PRECISION (finer 0.01 grid)."""
    best = None
    for t in [round(0.70 + 0.01 * i, 2) for i in range(29)]:
        s = score(pairs, t, GUARD_SETS["all"])
        if s["precision"] >= TARGET_PRECISION and (best is None or s["recall"] > best["recall"]):
            best = s
    return best or score(pairs, 0.98, GUARD_SETS["all"])


def _table(rows: list[dict], title: str, key: str) -> str:
    out = [f"\n### {title}\n", f"| {key} | precision | recall | served | false hits |",
           "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        out.append(
            f"| {r[key]} | {r['precision']:.3f} | {r['recall']:.3f} | {r['served']} "
            f"| {r['false_hits']} |"
        )
    return "\n".join(out)


def report(name: str, pairs: list[Pair], threshold: float) -> tuple[str, dict]:
    sweep = {g: [score(pairs, t, GUARD_SETS[g]) for t in THRESHOLDS] for g in ("none", "all")}
    guards_at = [{"guards": g, **score(pairs, threshold, gs)} for g, gs in GUARD_SETS.items()]
    pos = sum(p.label for p in pairs)
    md = [
        f"\n## {name}: {len(pairs)} pairs ({pos} paraphrases, {len(pairs) - pos} non-paraphrases)"
    ]
    for g in ("all", "none"):
        md.append(_table(sweep[g], f"{name}, guards {g}: threshold sweep", "threshold"))
    md.append(_table(guards_at, f"{name}: what each guard buys at threshold {threshold}", "guards"))
    leaks = score(pairs, threshold, GUARD_SETS["all"])["false_hits_by_kind"]
    md.append(f"\nFalse hits by kind at {threshold} with all guards: {leaks or 'none'}")
    return "\n".join(md), {"sweep": sweep, "guards": guards_at}


async def main_async(args: argparse.Namespace) -> tuple[str, dict]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    worker = AsyncEmbedder(make_embedder(args.embedder))
    chat = load_chat()
    paws = load_paws(args.paws)
    t0 = time.perf_counter()
    await measure_similarities(chat, worker)
    await measure_similarities(paws, worker)
    elapsed = time.perf_counter() - t0
    worker.close()
    chosen = choose_threshold(chat)
    t = chosen["threshold"]
    # Held-out check: choose on half the chat pairs, score the other half.
    half_t = choose_threshold(chat[0::2])["threshold"]
    held = score(chat[1::2], half_t, GUARD_SETS["all"])
    md_chat, js_chat = report("chat_pairs.tsv", chat, t)
    md_paws, js_paws = report("PAWS wiki dev sample", paws, t)
    head = (
        f"# Semantic cache quality ({worker.embedder.name} embedder)\n\n"
        f"Chosen threshold {t} (chat set, all guards): precision {chosen['precision']:.3f}, "
        f"recall {chosen['recall']:.3f} (target precision >= {TARGET_PRECISION}). "
        f"{len(chat) + len(paws)} pairs through the cache in {elapsed:.1f} s.\n\n"
        f"Held out: threshold chosen on even rows ({half_t}) scores precision "
        f"{held['precision']:.3f}, recall {held['recall']:.3f} on odd rows."
    )
    md = head + "\n" + md_chat + "\n" + md_paws + "\n"
    payload = {
        "chosen": chosen,
        "held_out": held,
        "embedder": worker.embedder.name,
        "chat": js_chat,
        "paws": js_paws,
    }
    return md, payload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paws", type=int, default=2000, help="PAWS pairs to sample")
    ap.add_argument("--embedder", default="auto", choices=["auto", "torch", "onnx"])
    ap.add_argument("--out-dir", default=str(DATA / "results"))
    args = ap.parse_args()
    md, payload = asyncio.run(main_async(args))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "semantic_quality.md").write_text(md, encoding="utf-8")
    (out / "semantic_quality.json").write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    print(md)


if __name__ == "__main__":
    main()
