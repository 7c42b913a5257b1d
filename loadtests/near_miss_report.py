"""Which hand-written near misses the shipped verifier serves, on TUNE splits only.

    python -m loadtests.near_miss_report --cosine-cache /tmp/cos.json [--model M.json]

Sets (each its tune split, as `loadtests.train_verifier` makes it; the holdout split is never
read): the candidate files (`loadtests/data/candidates/*.tsv`, split as if they were in
`written/`, which is where the trainer would read them), the written files, chat_pairs.tsv and
PAWS-Wiki dev. For the verifier at its default threshold, per set: paraphrases served and hard
negatives served (pairs at cosine >= the retrieval floor, as the trainer's "chat" group counts
them, and over all pairs), broken down by negative kind and by file; the trainer's shared-cache
run on the split (`SharedTune`); and the worst served negatives of the candidate files.

The decision is the runtime's own: `Verifier.probabilities` (with any rule it applies on top of
the trees), one pair at a time, the new question asked against the cached first sentence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from gateway.cache import verifier as verifier_module
from gateway.cache.verifier import Verifier
from loadtests.train_verifier import SharedTune, embed_cosines, embed_texts
from loadtests.verifier_data import (
    Pair,
    _load_folder,
    load_chat,
    load_paws,
    load_written,
    mine_negatives,
    split_of,
)

#: A pair's probability from (asked, cached, cosine).
Prob = Callable[[str, str, float], float]


def load_candidates() -> list[Pair]:
    """The candidate files, each pair in the split it would get in `written/` (by first sentence,
    the same hash and prefix), marked as written pairs like the trainer would read them."""
    pairs = _load_folder("candidates", None)
    for p in pairs:
        p.split = split_of(f"written:{p.s1.lower()}")
        p.source = "written"
    return pairs


def tune_sets() -> dict[str, list[Pair]]:
    """Name -> the tune split of each set (never the holdout)."""
    return {
        "candidates": [p for p in load_candidates() if p.split == "tune"],
        "written": [p for p in load_written() if p.split == "tune"],
        "chat": [p for p in load_chat() if p.split == "tune"],
        "paws": [p for p in load_paws() if p.split == "tune"],
    }


def verifier_prob(v: Verifier) -> Prob:
    """The runtime's probability for one pair, memoised (SharedTune asks many pairs twice)."""
    memo: dict[tuple[str, str], float] = {}

    def prob(asked: str, cached: str, cosine: float) -> float:
        key = (asked, cached)
        if key not in memo:
            memo[key] = v.probabilities(asked, [(cached, cosine)])[0]
        return memo[key]

    return prob


def served(p: Pair, prob: Prob, threshold: float, floor: float) -> bool:
    return p.cosine >= floor and prob(p.s2, p.s1, p.cosine) >= threshold


def pair_rates(
    pairs: list[Pair], prob: Prob, threshold: float, floor: float
) -> dict[str, float | int]:
    """Paraphrases and negatives served, over pairs at >= the floor (the trainer's count) and
    over all pairs (a pair below the floor is never served)."""
    pos = [p for p in pairs if p.label]
    neg = [p for p in pairs if not p.label]
    pos_f = [p for p in pos if p.cosine >= floor]
    neg_f = [p for p in neg if p.cosine >= floor]
    hit = sum(served(p, prob, threshold, floor) for p in pos)
    false = sum(served(p, prob, threshold, floor) for p in neg)
    return {
        "paraphrases": len(pos),
        "negatives": len(neg),
        "paraphrases_served": hit,
        "negatives_served": false,
        "hit_floor": hit / max(1, len(pos_f)),
        "false_floor": false / max(1, len(neg_f)),
        "hit_all": hit / max(1, len(pos)),
        "false_all": false / max(1, len(neg)),
    }


def breakdown(
    pairs: list[Pair], prob: Prob, threshold: float, floor: float, key: Callable[[Pair], str]
) -> dict[str, tuple[int, int, int]]:
    """key -> (negatives served, negatives at >= floor, negatives) for the negatives of `pairs`."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for p in pairs:
        if p.label:
            continue
        row = out[key(p)]
        row[0] += served(p, prob, threshold, floor)
        row[1] += p.cosine >= floor
        row[2] += 1
    return {k: (a, b, c) for k, (a, b, c) in sorted(out.items())}


def report(model: Path | None, cosine_cache: Path | None, worst: int) -> dict:
    """Every figure of the report as one JSON-able dict (printed as tables by `main`)."""
    if model is not None:
        v = Verifier(json.loads(model.read_text(encoding="utf-8")))
    else:
        v = verifier_module.default_verifier()
    sets = tune_sets()
    vectors = embed_texts(
        [x for name in ("candidates", "written", "chat") for p in sets[name] for x in (p.s1, p.s2)]
    )
    # The trainer's tune pairs hold mined negatives too (`mine_negatives`: the nearest other
    # questions of the same file): counted apart, as kind "mined", not in the shared run.
    mined = {name: mine_negatives(sets[name], vectors, 2) for name in ("candidates", "written")}
    everything = [p for pairs in [*sets.values(), *mined.values()] for p in pairs]
    asyncio.run(embed_cosines(everything, cache=cosine_cache))
    prob = verifier_prob(v)
    t, floor = v.threshold, v.retrieval_floor
    out: dict = {"threshold": t, "retrieval_floor": floor, "sets": {}}
    for name, pairs in sets.items():
        entry: dict = {"pairs": pair_rates(pairs, prob, t, floor)}
        if name in mined:
            entry["with_mined"] = pair_rates(pairs + mined[name], prob, t, floor)
        if name != "paws":
            entry["by_kind"] = breakdown(
                pairs + mined.get(name, []), prob, t, floor, lambda p: p.kind
            )
            entry["by_file"] = breakdown(pairs, prob, t, floor, lambda p: p.origin or p.source)
            entry["shared"] = SharedTune(pairs, vectors).at(t, pt_of=prob)
        out["sets"][name] = entry
    cands = [p for p in sets["candidates"] if not p.label and served(p, prob, t, floor)]
    scored = sorted(((prob(p.s2, p.s1, p.cosine), p) for p in cands), key=lambda x: -x[0])
    out["worst"] = [
        {"p": round(s, 3), "cos": round(p.cosine, 3), "kind": p.kind, "file": p.origin,
         "cached": p.s1, "asked": p.s2}
        for s, p in scored[:worst]
    ]  # fmt: skip
    return out


def print_report(r: dict) -> None:
    print(f"threshold {r['threshold']} retrieval floor {r['retrieval_floor']} (tune splits only)")
    print("\n| set (tune) | paraphrases served (>= floor / all) | negatives served "
          "(>= floor / all) | shared: right / wrong / near misses served |")  # fmt: skip
    print("|---|---|---|---|")
    for name, e in r["sets"].items():
        q = e["pairs"]
        sh = e.get("shared")
        shared = (
            f"{sh['right']:.1%} / {sh['wrong']:.1%} / {sh['near_misses_served']:.1%}" if sh else ""
        )
        print(
            f"| {name} ({q['paraphrases']} / {q['negatives']}) | {q['hit_floor']:.1%} / "
            f"{q['hit_all']:.1%} | {q['false_floor']:.1%} / {q['false_all']:.1%} "
            f"({q['negatives_served']}) | {shared} |"
        )
    print(
        "\nwith mined negatives (the trainer's tune pairs): paraphrases / negatives served, >= floor"
    )
    for name, e in r["sets"].items():
        if "with_mined" in e:
            q = e["with_mined"]
            print(f"  {name}: {q['hit_floor']:.1%} / {q['false_floor']:.1%} of {q['negatives']}")
    for name, e in r["sets"].items():
        for part in ("by_kind", "by_file"):
            if part not in e:
                continue
            print(f"\n{name}, negatives {part.replace('_', ' ')}: served / at >= floor / all")
            for k, (a, b, c) in e[part].items():
                print(f"  {k:28s} {a:4d} / {b:4d} / {c:4d}  ({a / max(1, b):.1%} of >= floor)")
    print(f"\nworst {len(r['worst'])} served negatives of the candidate files (tune):")
    for w in r["worst"]:
        print(f"  p={w['p']} cos={w['cos']} {w['kind']:9s} {w['file']}")
        print(f"      cached: {w['cached']}\n      asked:  {w['asked']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cosine-cache", default="", help="JSON file memoising pair cosines")
    ap.add_argument("--model", default="", help="another verifier model file (default: shipped)")
    ap.add_argument("--worst", type=int, default=20, help="served negatives listed")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args = ap.parse_args()
    r = report(
        Path(args.model) if args.model else None,
        Path(args.cosine_cache) if args.cosine_cache else None,
        args.worst,
    )
    print_report(r)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
