"""Build chat_pairs.tsv: chat-style questions, paraphrases (1) and near misses (0).

Deterministic (seeded). Columns: id, sentence1, sentence2, label, kind. Kinds of label 0:
entity (another city, product, language...), number, negation, swap (roles exchanged), related
(same topic, another question, often with lowercase words no guard can see: "boil eggs" vs
"boil potatoes"). Label 1 pairs use other wording, digits vs number words, lowercase and no
punctuation, symmetric reorderings ("A vs B" / "B vs A") and active/passive.

Run: python -m loadtests.data.build_chat_pairs  (rewrites loadtests/data/chat_pairs.tsv)
"""

from __future__ import annotations

import random
from pathlib import Path

from loadtests.data.chat_families import HANDWRITTEN, TEMPLATES, Template

OUT = Path(__file__).with_name("chat_pairs.tsv")
_NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve"
_WORDS = _NUMBER_WORDS.split()


def _casual(text: str, rng: random.Random) -> str:
    """Chat users often type in lowercase without the question mark."""
    return text.lower().rstrip("?").strip() if rng.random() < 0.25 else text


def _fill(template: str, binding: dict[str, str], rng: random.Random) -> str:
    values = dict(binding)
    for key, val in binding.items():
        if "|" in val:  # a matched pair of values, e.g. "miles|kilometers"
            values[key + "1"], values[key + "2"] = val.split("|")
        if val.isdigit() and int(val) < len(_WORDS) and rng.random() < 0.3:
            values[key] = _WORDS[int(val)]  # "2" or "two": the same question
    return template.format(**values)


def _bind(t: Template, rng: random.Random) -> dict[str, str]:
    return {k: rng.choice(v) for k, v in t.slots.items()}


def _variant(t: Template, binding: dict[str, str], rng: random.Random) -> tuple[dict, str] | None:
    """The binding with one near-miss change, and the kind of change."""
    mode = rng.choice(t.modes)
    if mode == "swap":
        a, b = t.swap
        if binding[a] == binding[b]:
            return None
        return {**binding, a: binding[b], b: binding[a]}, "swap"
    key = rng.choice([k for k in t.slots if t.kind_of(k) == mode] or list(t.slots))
    others = [v for v in t.slots[key] if v != binding[key]]
    return {**binding, key: rng.choice(others)}, t.kind_of(key)


def _templated(rng: random.Random) -> list[tuple[str, str, int, str]]:
    rows = []
    for t in TEMPLATES:
        for _ in range(t.samples):
            binding = _bind(t, rng)
            i, j = rng.sample(range(len(t.phrasings)), 2)
            s1 = _fill(t.phrasings[i], binding, rng)
            rows.append((s1, _casual(_fill(t.phrasings[j], binding, rng), rng), 1, "paraphrase"))
            changed = _variant(t, binding, rng)
            if changed is not None:
                other, kind = changed
                k = rng.randrange(len(t.phrasings))
                if kind == "swap" and t.symmetric:
                    rows.append((s1, _fill(t.phrasings[k], other, rng), 1, "symmetric"))
                else:
                    rows.append((s1, _casual(_fill(t.phrasings[k], other, rng), rng), 0, kind))
            for negated in t.negations:
                rows.append((s1, _casual(_fill(negated, binding, rng), rng), 0, "negation"))
    return rows


def _handwritten(rng: random.Random) -> list[tuple[str, str, int, str]]:
    rows = []
    for base, paraphrases, near in HANDWRITTEN:
        for p in paraphrases:
            rows.append((base, _casual(p, rng), 1, "paraphrase"))
        for text, kind in near:
            rows.append((base, _casual(text, rng), 0, kind))
    return rows


def build(seed: int = 7) -> list[tuple[str, str, int, str]]:
    rng = random.Random(seed)
    rows = _templated(rng) + _handwritten(rng)
    seen: set[tuple[str, str]] = set()
    unique = []
    for s1, s2, label, kind in rows:
        if s1.lower() == s2.lower().rstrip("?") + ("?" if s1.endswith("?") else ""):
            continue  # identical after casing: not a paraphrase test
        if (s1, s2) not in seen:
            seen.add((s1, s2))
            unique.append((s1, s2, label, kind))
    rng.shuffle(unique)
    return unique


def main() -> None:
    rows = build()
    lines = ["id\tsentence1\tsentence2\tlabel\tkind"]
    lines += [
        f"{i}\t{s1}\t{s2}\t{label}\t{kind}" for i, (s1, s2, label, kind) in enumerate(rows, 1)
    ]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pos = sum(r[2] for r in rows)
    print(f"{len(rows)} pairs ({pos} paraphrases, {len(rows) - pos} near misses) -> {OUT}")


if __name__ == "__main__":
    main()
