"""Near-miss guards: cheap lexical checks that veto a semantic match.

Sentence embeddings place "How far is Paris from Lyon?" and "How far is Paris from Nice?" (or
"Is it safe to take ibuprofen" and "Is it not safe to take ibuprofen") very close together. An
answer served for the wrong one is worse than a miss, so after the similarity threshold these
guards compare the two texts directly and reject a candidate when they differ in numbers,
negation, named entities or the order of those entities. They are heuristics tuned for
precision: a false rejection costs one upstream call, a false acceptance a wrong answer.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from gateway.cache.semantic_settings import GuardSettings

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:['’][A-Za-z]+)?|\d+(?:[.,]\d+)*(?:st|nd|rd|th|k)?")
_SENT_END = re.compile(r"(?:^|[.!?:;\n\"“(\[]\s*|^\s*[-*•]\s*)$")
# An auxiliary, then "<participle> by" a few words later: "was beaten by", "Was Brazil beaten by".
_PASSIVE = re.compile(
    r"\b(?:is|are|was|were|be|been|being|get|gets|got)\b(?:\s+[\w'’-]+){0,4}?\s+\w{3,}\s+by\b"
)
_GAP_NOISE = re.compile(r"[\s,;/&()\"'“”]+")

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "dozen": 12,
}  # fmt: skip
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_ORDINALS = {
    "first": 1, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "second": 2,
}  # fmt: skip
_NEGATION_WORDS = (
    "not no never none nobody nothing neither nor nowhere without cannot cant dont doesnt didnt "
    "isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt mustnt"
)
_NEGATIONS = frozenset(_NEGATION_WORDS.split())
_SYMMETRIC_GAPS = frozenset(["", "and", "or", "vs", "vs.", "versus", "and or", "with", "to"])
# Capitalised words at the start of a sentence that are not names.
_STARTER_WORDS = """a about after all also an and another any anyone are as at be before best
    between but by
    can could compare convert calculate create define describe did do does during each every
    explain find fix for from generate give good has have hello help hey hi how how's i i'd i'll
    i'm i've if im in is it it's its just let let's lets list looking make many may me might
    more most much must my name need no now of ok okay on one or other our please provide
    quick recommend rewrite same should show since so some someone suggest summarise summarize
    tell thank thanks that the then there these this those to top translate two want was we
    were what what's whats when where where's which who who's whom whose why why's will with
    would write yes you your"""
_STARTERS = frozenset(_STARTER_WORDS.split())


@dataclass(frozen=True, slots=True)
class _Features:
    lower: str
    numbers: tuple[str, ...]
    number_pos: tuple[int, ...]
    negated: bool
    entities: tuple[str, ...]
    passive: bool


def _canon(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.6g}"


def _digit_value(tok: str) -> str:
    low = tok.lower()
    for suffix in ("st", "nd", "rd", "th"):
        if low.endswith(suffix):
            return "ord:" + low[: -len(suffix)].replace(",", "")
    mult = 1000 if low.endswith("k") else 1
    low = low.rstrip("k")
    low = (
        low.replace(",", "") if re.fullmatch(r"\d{1,3}(?:,\d{3})+", low) else low.replace(",", ".")
    )
    try:
        return _canon(float(low) * mult)
    except ValueError:
        return low


def _numbers(tokens: list[tuple[str, int]]) -> tuple[list[str], list[int]]:
    """Numbers as canonical strings in text order: "5,000", "5000" and "five thousand" agree."""
    values: list[str] = []
    positions: list[int] = []
    i = 0
    while i < len(tokens):
        tok, pos = tokens[i]
        low = tok.lower()
        if tok[0].isdigit():
            value = _digit_value(tok)
            nxt = tokens[i + 1][0].lower() if i + 1 < len(tokens) else ""
            if nxt in _SCALES and not value.startswith("ord:"):
                value = _canon(float(value) * _SCALES[nxt])
                i += 1
            values.append(value)
            positions.append(pos)
        elif low in _ORDINALS:
            values.append(f"ord:{_ORDINALS[low]}")
            positions.append(pos)
        elif low in _UNITS or (low == "a" and _next_is_scale(tokens, i)):
            total, i = _parse_words(tokens, i)
            if total is not None:
                values.append(_canon(total))
                positions.append(pos)
            continue
        i += 1
    return values, positions


def _next_is_scale(tokens: list[tuple[str, int]], i: int) -> bool:
    return i + 1 < len(tokens) and tokens[i + 1][0].lower() in _SCALES


def _parse_words(tokens: list[tuple[str, int]], i: int) -> tuple[float | None, int]:
    """Parse "two hundred and five" from tokens[i]; a lone "one" is a pronoun, not a number."""
    total = current = 0.0
    count = 0
    while i < len(tokens):
        low = tokens[i][0].lower()
        if low in _UNITS:
            current += _UNITS[low]
        elif low == "a" and count == 0:
            current = 1
        elif low in _SCALES:
            current = max(current, 1) * _SCALES[low]
            if _SCALES[low] >= 1000:
                total, current = total + current, 0.0
        elif low == "and" and count and i + 1 < len(tokens) and tokens[i + 1][0].lower() in _UNITS:
            pass
        else:
            break
        count += 1
        i += 1
    if count == 1 and tokens[i - 1][0].lower() == "one":
        return None, i
    return total + current, i


def _is_sentence_start(text: str, pos: int) -> bool:
    return pos == 0 or bool(_SENT_END.search(text[max(0, pos - 4) : pos]))


def _entities(text: str, tokens: list[tuple[str, int]]) -> list[str]:
    """Capitalised words and acronyms, consecutive ones merged ("New York"), in text order."""
    words = [(t, p) for t, p in tokens if t[0].isalpha()]
    caps = sum(1 for t, _ in words if t[0].isupper())
    if len(words) >= 4 and caps / len(words) > 0.6:
        return []  # Title Case or shouting: capitals carry no signal
    found: list[str] = []
    prev_end = -2
    for tok, pos in words:
        if pos and text[pos - 1].isalnum():
            continue  # the tail of "4S", "3D", "50MG": part of a number, not a name
        low = tok.lower().removesuffix("'s").removesuffix("’s")
        is_entity = tok[0].isupper() and low not in ("i", "i'm", "i've", "i'd", "i'll")
        if is_entity and _is_sentence_start(text, pos) and low in _STARTERS:
            is_entity = False
        if is_entity:
            if found and text[prev_end:pos].strip() == "":
                found[-1] = f"{found[-1]} {low}"
            else:
                found.append(low)
            prev_end = pos + len(tok)
    return found


@lru_cache(maxsize=8192)
def _analyse(text: str) -> _Features:
    tokens = [(m.group(), m.start()) for m in _WORD.finditer(text)]
    lower = text.lower()
    numbers, number_pos = _numbers(tokens)
    negated = any(
        t.lower().replace("'", "").replace("’", "") in _NEGATIONS
        or t.lower().endswith(("n't", "n’t"))
        for t, _ in tokens
    )
    return _Features(
        lower=lower,
        numbers=tuple(numbers),
        number_pos=tuple(number_pos),
        negated=negated,
        entities=tuple(_entities(text, tokens)),
        passive=bool(_PASSIVE.search(lower)),
    )


def _contains(lower: str, phrase: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(phrase) + r"(?![a-z0-9])", lower) is not None


def _order_in(lower: str, shared: list[str]) -> tuple[list[str], bool]:
    """Shared entities sorted by first position, and whether only "and"/"or"/"vs" join them."""
    spans = sorted((lower.find(e), e) for e in shared)
    symmetric = all(
        _GAP_NOISE.sub(" ", lower[a + len(ea) : b]).strip() in _SYMMETRIC_GAPS
        for (a, ea), (b, _) in zip(spans, spans[1:], strict=False)
    )
    return [e for _, e in spans], symmetric


def _entity_check(q: _Features, c: _Features, presence: bool, order: bool) -> str | None:
    if presence:
        for ent in q.entities:
            if not _contains(c.lower, ent):
                return "entity"
        for ent in c.entities:
            if not _contains(q.lower, ent):
                return "entity"
    if not order:
        return None
    ents = set(q.entities) | set(c.entities)
    shared = sorted(e for e in ents if _contains(q.lower, e) and _contains(c.lower, e))
    if len(shared) < 2:
        return None
    q_order, q_sym = _order_in(q.lower, shared)
    c_order, c_sym = _order_in(c.lower, shared)
    if q_sym and c_sym:
        return None  # "A and B" vs "B and A"
    if q.passive != c.passive:  # "X beat Y" vs "Y was beaten by X": the voice flips the order
        c_order = c_order[::-1]
    return None if q_order == c_order else "entity_order"


def check(query: str, candidate: str, settings: GuardSettings) -> str | None:
    """Name of the first guard that rejects `candidate` as an answer to `query`, or None."""
    q, c = _analyse(query), _analyse(candidate)
    if settings.numbers and _numbers_differ(q, c, settings.entity_order):
        return "number"
    if settings.negation and q.negated != c.negated:
        return "negation"
    if settings.entities or settings.entity_order:
        return _entity_check(q, c, settings.entities, settings.entity_order)
    return None


def each_alone(query: str, candidate: str) -> dict[str, bool]:
    """Whether each guard alone (the others off) rejects `candidate`: what `check` says with one
    guard on, by guard name ("numbers", "negation", "entities", "entity_order"), the texts read
    once (the verifier's features, for every pair it judges)."""
    q, c = _analyse(query), _analyse(candidate)
    return {
        "numbers": _numbers_differ(q, c, symmetric_ok=False),
        "negation": q.negated != c.negated,
        "entities": _entity_check(q, c, True, False) is not None,
        "entity_order": _entity_check(q, c, False, True) is not None,
    }


def _numbers_differ(q: _Features, c: _Features, symmetric_ok: bool) -> bool:
    """Whether the texts name other numbers; the same ones in another order count as the same
    only with `symmetric_ok` (the entity-order guard on) and joined by coordinators on both
    sides ("3 or 5" / "5 or 3", not "from 3 to 5" / "from 5 to 3")."""
    if q.numbers == c.numbers:
        return False
    if Counter(q.numbers) != Counter(c.numbers):
        return True
    return not symmetric_ok or not _numbers_symmetric(q, c)


def _numbers_symmetric(q: _Features, c: _Features) -> bool:
    def joined_by_coordinators(f: _Features) -> bool:
        gaps = [f.lower[a:b] for a, b in zip(f.number_pos, f.number_pos[1:], strict=False)]
        return all(
            _GAP_NOISE.sub(" ", _WORD.sub("", g, count=1)).strip() in _SYMMETRIC_GAPS for g in gaps
        )

    return joined_by_coordinators(q) and joined_by_coordinators(c)
