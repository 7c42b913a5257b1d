"""Features of a (new question, cached question) pair for the semantic cache's verifier.

The embedding says two questions are about the same thing; these features say whether they ask
the same thing: what one says and the other does not (content words, numbers, entities,
operators), meaning flips no embedding sees well (antonyms, am/pm, negation), and order (the
direction of "from X to Y", who beat whom, PAWS-style word swaps). Pure Python on short texts:
tens of microseconds per pair.
"""

from __future__ import annotations

import re
from functools import lru_cache

from gateway.cache import guards

# Letters and digits of any script: a Chinese or Russian question must not look empty (and so
# "identical" to any other) to the lexical features.
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?")
_NOT_WORD = re.compile(r"[^\w+#]|_")
_OPERATOR = re.compile(
    r"===|!==|<<=?|>>=?|&&|\|\||\*\*|[-+*/%&|^]=|<=|>=|==|!=|<>|=>|->|[<>]"
    r"|(?<=[\w)\s])[+*/%^](?=[\s\w(])|\s-\s"
)
# Operators that change what code does when swapped: comparisons, logic, shifts, compound
# assignment (`x += 1` / `x -= 1`). Lone arithmetic signs are not among them: a " - " or "+" is
# as often a dash or "and" in chat as arithmetic.
_COMPARISONS = frozenset(
    ["<", ">", "<=", ">=", "==", "!=", "<>", "=>", "->", "===", "!==", "&&", "||", "**",
     "<<", ">>", "<<=", ">>=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^="]
)  # fmt: skip
_TOKEN = re.compile(f"{_OPERATOR.pattern}|{_WORD.pattern}")
_CAPS = re.compile(r"(?<![\w.])[A-Z][\w.+#-]*|(?<![\w.])[a-z]+[A-Z][\w.+#-]*")

_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "from",
        "by",
        "with",
        "about",
        "as",
        "into",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "doing",
        "have",
        "has",
        "had",
        "having",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "he",
        "she",
        "it",
        "its",
        "they",
        "them",
        "their",
        "this",
        "that",
        "these",
        "those",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "can",
        "could",
        "would",
        "should",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "there",
        "here",
        "and",
        "or",
        "but",
        "if",
        "then",
        "so",
        "than",
        "too",
        "very",
        "just",
        "also",
        "please",
        "tell",
        "give",
        "show",
        "explain",
        "know",
        "want",
        "need",
        "get",
        "some",
        "any",
        "all",
        "each",
        "every",
        "much",
        "many",
        "more",
        "most",
        "one",
        "way",
        "best",
        "good",
        "s",
        "t",
    ]
)
# Words that flip the answer when exchanged; both directions are listed.
_ANTONYM_PAIRS = [
    "enable",
    "disable",
    "enabled",
    "disabled",
    "on",
    "off",
    "safe",
    "unsafe",
    "increase",
    "decrease",
    "increasing",
    "decreasing",
    "up",
    "down",
    "upload",
    "download",
    "uploading",
    "downloading",
    "import",
    "export",
    "encrypt",
    "decrypt",
    "encryption",
    "decryption",
    "lock",
    "unlock",
    "zip",
    "unzip",
    "install",
    "uninstall",
    "show",
    "hide",
    "visible",
    "hidden",
    "high",
    "low",
    "higher",
    "lower",
    "highest",
    "lowest",
    "male",
    "female",
    "men",
    "women",
    "man",
    "woman",
    "boy",
    "girl",
    "am",
    "pm",
    "before",
    "after",
    "above",
    "below",
    "over",
    "under",
    "max",
    "min",
    "maximum",
    "minimum",
    "largest",
    "smallest",
    "biggest",
    "smallest",
    "bigger",
    "smaller",
    "larger",
    "smaller",
    "more",
    "less",
    "most",
    "least",
    "buy",
    "sell",
    "buying",
    "selling",
    "bought",
    "sold",
    "push",
    "pull",
    "add",
    "remove",
    "added",
    "removed",
    "open",
    "close",
    "opened",
    "closed",
    "open",
    "closed",
    "start",
    "stop",
    "started",
    "stopped",
    "begin",
    "end",
    "first",
    "last",
    "best",
    "worst",
    "better",
    "worse",
    "good",
    "bad",
    "positive",
    "negative",
    "true",
    "false",
    "yes",
    "no",
    "left",
    "right",
    "north",
    "south",
    "east",
    "west",
    "horizontally",
    "vertically",
    "horizontal",
    "vertical",
    "sunrise",
    "sunset",
    "rise",
    "set",
    "win",
    "lose",
    "won",
    "lost",
    "winning",
    "losing",
    "hot",
    "cold",
    "heat",
    "cool",
    "warm",
    "cool",
    "fast",
    "slow",
    "faster",
    "slower",
    "cheap",
    "expensive",
    "cheaper",
    "dearer",
    "easy",
    "hard",
    "easier",
    "harder",
    "light",
    "dark",
    "inside",
    "outside",
    "input",
    "output",
    "read",
    "write",
    "reading",
    "writing",
    "sender",
    "receiver",
    "send",
    "receive",
    "client",
    "server",
    "ascending",
    "descending",
    "asc",
    "desc",
    "import",
    "export",
    "internal",
    "external",
    "private",
    "public",
    "before",
    "after",
    "morning",
    "evening",
    "day",
    "night",
    "pros",
    "cons",
    "advantages",
    "disadvantages",
    "benefits",
    "risks",
    "enter",
    "exit",
    "login",
    "logout",
    "connect",
    "disconnect",
    "mount",
    "unmount",
    "allow",
    "deny",
    "accept",
    "reject",
    "include",
    "exclude",
    "inclusive",
    "exclusive",
    "import",
    "export",
    "encode",
    "decode",
    "compress",
    "decompress",
    "serialize",
    "deserialize",
    "mute",
    "unmute",
    "follow",
    "unfollow",
    "subscribe",
    "unsubscribe",
    "renew",
    "cancel",
    "debit",
    "credit",
    "profit",
    "loss",
    "gain",
    "lose",
    "asleep",
    "awake",
    "wet",
    "dry",
    "full",
    "empty",
    "young",
    "old",
    "new",
    "old",
    "past",
    "future",
    "earlier",
    "later",
    "early",
    "late",
]
_ANTONYMS: dict[str, set[str]] = {}
for _a, _b in zip(_ANTONYM_PAIRS[0::2], _ANTONYM_PAIRS[1::2], strict=True):
    _ANTONYMS.setdefault(_a, set()).add(_b)
    _ANTONYMS.setdefault(_b, set()).add(_a)
_NEGATIONS = frozenset(
    [
        "not",
        "no",
        "never",
        "none",
        "nobody",
        "nothing",
        "neither",
        "nor",
        "nowhere",
        "without",
        "cannot",
        "cant",
        "dont",
        "doesnt",
        "didnt",
        "isnt",
        "arent",
        "wasnt",
        "werent",
        "wont",
        "wouldnt",
        "shouldnt",
        "couldnt",
        "hasnt",
        "havent",
        "hadnt",
        "mustnt",
    ]
)
# Spellings of one thing; compared after mapping to the first form.
_ALIASES = {
    "js": "javascript", "ts": "typescript", "py": "python", "k8s": "kubernetes",
    "nyc": "new york city", "usa": "united states", "us": "united states",
    "uk": "united kingdom", "postgres": "postgresql", "nodejs": "node.js", "node": "node.js",
    "golang": "go", "cpp": "c++", "eur": "euro", "euros": "euro", "usd": "dollar",
    "dollars": "dollar", "km": "kilometer", "kms": "kilometers", "kg": "kilogram",
    "g": "gram", "grams": "gram", "lbs": "pound", "lb": "pound", "mins": "minutes",
    "hrs": "hours", "min": "minute", "ai": "artificial intelligence", "ml": "machine learning",
    "tv": "television", "pc": "computer", "2fa": "two-factor",
    "ww2": "second world war", "wwii": "second world war", "ww1": "first world war",
    "wwi": "first world war",
    # contractions typed without the apostrophe
    "dont": "do not", "doesnt": "does not", "didnt": "did not", "cant": "can not",
    "cannot": "can not", "isnt": "is not", "arent": "are not", "wasnt": "was not",
    "wont": "will not", "wouldnt": "would not", "shouldnt": "should not",
    "couldnt": "could not", "havent": "have not", "hasnt": "has not", "im": "i am",
    "ive": "i have", "whats": "what is", "hows": "how is", "wheres": "where is",
    "whos": "who is", "thats": "that is",
}  # fmt: skip
_IRREGULAR_NOT = {"can": "can", "ca": "can", "wo": "will", "sha": "shall"}
_CLITICS = {"re": "are", "ve": "have", "ll": "will", "m": "am", "d": "would"}


def _expand(word: str) -> str:
    """Contractions as their words ("what's" -> "what", "don't" -> "do not", "we're" -> "we
    are"): "What's the best..." and "What is the best..." must not differ by a content word.
    A possessive or "is" 's is dropped (both are stop words or the name itself)."""
    word = word.replace("’", "'")
    if "'" not in word:
        return word
    if word.endswith("n't"):
        head = word[:-3]
        return _IRREGULAR_NOT.get(head, head) + " not"
    head, _, tail = word.rpartition("'")
    if tail == "s":
        return head
    return f"{head} {_CLITICS[tail]}" if tail in _CLITICS else word


#: Negation said with a verb or phrase: "which foods should I not eat" asks what "which foods
#: should I avoid" asks, so both count one negation. The verbs were added on the tune split: near
#: misses served 3.7 -> 3.5% at the default, no paraphrase lost (BENCHMARKS.md).
_NEGATING_PHRASE = re.compile(
    r"\b(?:in the absence of|absent|lack of|lacking|lacks?|avoid(?:ed|ing|s)?|stay away from"
    r"|steer clear of|refrain from|keep away from"
    # and an exception: "crashing unless I'm on Wi-Fi" is "crashing when I'm not on Wi-Fi"
    r"|unless)\b"
)
#: and with an affix: "flightless" birds "can't fly", "gluten-free" foods "don't contain gluten",
#: "non-residents" are people who are "not residents". Five paraphrases more served on the
#: holdout sets, none of their near misses; no change on the tune split (BENCHMARKS.md).
_NEGATING_AFFIX = re.compile(
    r"\b(?:(?!regardless|nevertheless|nonetheless|doubtless)\w{3,}less(?:ness)?|\w+-free"
    r"|non-\w+|(?!nonsense|nonetheless|nonchalant)non\w{4,})\b"
)


def _negations(lower: str, words: list[str]) -> int:
    """Negations counted in words, contractions, phrases and affixes."""
    negs = sum(1 for w in words if w.replace("'", "").replace("’", "") in _NEGATIONS)
    negs += sum(1 for w in words if w.endswith(("n't", "n’t")))
    negs += len(_NEGATING_PHRASE.findall(lower))
    if "less" in lower or "free" in lower or "non" in lower:
        negs += len(_NEGATING_AFFIX.findall(lower))
    return negs


FEATURES = (
    "cosine",
    "word_jaccard",
    "content_jaccard",
    "char3_jaccard",
    "bigram_jaccard",
    "swap_gap",
    "lcs_ratio",
    "discordant",
    "len_ratio",
    "only_q",
    "only_c",
    "only_max",
    "only_min",
    "numbers_differ",
    "numbers_reordered",
    "negation_differs",
    "antonym",
    "operators_differ",
    "direction_flip",
    "entities_missing",
    "entity_order",
    "passive_differs",
    "guard_number",
    "guard_negation",
    "guard_entity",
    "guard_entity_order",
    "words",
    "block_move",
    "conj_swap",
    "role_changes",
    "asks_differ",
    "asks_match",
    "and_or_swap",
)


#: Order features (quadratic) look at the first words only: a cached question is at most
#: max_tokens long, and 600-word texts would cost ~100 ms a pair uncapped.
_ORDER_WORDS = 64


@lru_cache(maxsize=16384)  # ~25 calls a pair judged, on words a vocabulary bounds
def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


class _Text:
    __slots__ = ("bigrams", "char3", "compact", "content", "lower", "negations", "numbers",
                 "operators", "raw", "words", "entities", "direction", "flat",
                 "passive")  # fmt: skip

    def __init__(self, raw: str) -> None:
        self.raw = raw
        lower = raw.lower()
        self.lower = lower
        # operators are words too: `x == None` / `x is None` swapped around "but" must differ
        tokens = [t.strip() for t in _TOKEN.findall(lower)]
        words = [_ALIASES.get(w, w) for w in " ".join(map(_expand, tokens)).split()]
        words = " ".join(words).split()  # aliases may be several words
        self.words = words
        self.content = [_stem(w) for w in words if w not in _STOP and not w.isdigit()]
        self.bigrams = set(zip(words, words[1:], strict=False))
        # both spellings: "Huggingface.js" must find "hugging face.js", "JS" "javascript"
        self.flat = _NOT_WORD.sub("", lower)
        self.compact = self.flat + "|" + _NOT_WORD.sub("", " ".join(words))
        self.passive = bool(guards._PASSIVE.search(lower))
        self.char3 = {self.compact[i : i + 3] for i in range(max(1, len(self.compact) - 2))}
        self.numbers = tuple(w for w in words if w[0].isdigit())
        self.negations = _negations(lower, words)
        # comparisons only: a " - " or "+" is as often a dash or "and" in chat as arithmetic
        self.operators = tuple(sorted(o for o in map(str.strip, _OPERATOR.findall(raw))
                                      if o in _COMPARISONS))  # fmt: skip
        self.entities = [
            _NOT_WORD.sub("", e.lower())
            for e in _CAPS.findall(raw)
            if e.lower() not in _STOP and e.lower() not in guards._STARTERS
        ]
        self.direction = _direction(words)


def _direction(words: list[str]) -> tuple[str, str] | None:
    """(source, target) of "from X to Y" / "X to Y" / "X into Y", the words right after each."""
    for i, w in enumerate(words):
        if w == "from" and i + 1 < len(words):
            for j in range(i + 2, min(len(words), i + 6)):
                if words[j] in ("to", "into") and j + 1 < len(words):
                    return words[i + 1], words[j + 1]
    for j, w in enumerate(words):
        if w in ("to", "into") and 0 < j < len(words) - 1 and words[j - 1] not in _STOP:
            return words[j - 1], words[j + 1]
    return None


@lru_cache(maxsize=16384)
def _text(raw: str) -> _Text:
    return _Text(raw)


def _jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _lcs(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of words.

    Bit-parallel (Crochemore et al., 2001): one row of the dynamic programme is an integer's bits,
    so the work is one pass over `a` with a few big-integer operations per word instead of a
    Python loop over every cell (0.9 ms for two 30-word questions, now ~20 µs).
    """
    if not a or not b:
        return 0
    where: dict[str, int] = {}
    for j, y in enumerate(b):
        where[y] = where.get(y, 0) | (1 << j)
    mask = (1 << len(b)) - 1
    row = mask  # a 1 bit: that column's value did not grow yet
    for x in a:
        match = row & where.get(x, 0)
        row = ((row + match) | (row - match)) & mask
    return len(b) - row.bit_count()


def _discordant(a: list[str], b: list[str]) -> float:
    """Share of pairs of shared words whose order differs between the texts (0: same order)."""
    pos_b: dict[str, int] = {}
    for i, w in enumerate(b):
        pos_b.setdefault(w, i)
    seen: set[str] = set()
    seq = []
    for w in a:
        if w in pos_b and w not in seen:
            seen.add(w)
            seq.append(pos_b[w])
    n = len(seq)
    if n < 2:
        return 0.0
    bad = sum(1 for i in range(n) for j in range(i + 1, n) if seq[i] > seq[j])
    return bad / (n * (n - 1) / 2)


def _antonym(q: _Text, c: _Text) -> float:
    qs, cs = set(q.words), set(c.words)
    for w in qs - cs:
        if _ANTONYMS.get(w, set()) & (cs - qs):
            return 1.0
    # un-/dis- prefixes: safe/unsafe, like/dislike
    for w in qs ^ cs:
        for prefix in ("un", "dis", "in", "im", "non"):
            if w.startswith(prefix) and w[len(prefix) :] in (qs ^ cs) and len(w) > 4:
                return 1.0
    return 0.0


def _found(entity: str, other: _Text) -> bool:
    alias = _NOT_WORD.sub("", _ALIASES.get(entity, entity))
    return entity in other.compact or alias in other.compact


def _entities_missing(q: _Text, c: _Text) -> int:
    missing = sum(1 for e in q.entities if e and not _found(e, c))
    return missing + sum(1 for e in c.entities if e and not _found(e, q))


def _entity_order(q: _Text, c: _Text) -> float:
    """1 when names found in both texts (capitalised in either) come in another order, once the
    voice is accounted for ("X beat Y" / "Y was beaten by X" keep their meaning)."""
    shared = [
        e for e in dict.fromkeys(q.entities + c.entities) if e and e in q.flat and e in c.flat
    ]
    if len(shared) < 2:
        return 0.0
    q_order = sorted(shared, key=q.flat.find)
    c_order = sorted(shared, key=c.flat.find)
    if q.passive != c.passive:
        c_order.reverse()
    return 1.0 if q_order != c_order else 0.0


# Words that mark a noun's role: "from X to Y" and "to Y from X" keep each role, "from Y to X"
# swaps them. Spellings of one role are mapped to one form.
_ROLE = {"from": "from", "to": "to", "into": "to", "onto": "on", "of": "of", "in": "in",
         "on": "on", "at": "at", "by": "by", "for": "for", "with": "with", "than": "than",
         "between": "between", "over": "over", "under": "under", "against": "against",
         "per": "per", "via": "via", "without": "without", "versus": "versus"}  # fmt: skip
_CONJ = frozenset(["and", "or", "vs", "versus", "&"])
_FILLER = frozenset(["please", "can", "could", "you", "tell", "me", "i", "do", "does", "how"])


def _shared_order(a: list[str], b: list[str]) -> tuple[list[str], list[str], int, int]:
    """Both word lists cut to the words the other has too (fillers dropped, role words in one
    spelling), and the lengths of their common prefix and suffix: between those the orders
    differ."""
    sa, sb = set(a), set(b)
    xa = [_ROLE.get(w, w) for w in a if w in sb and w not in _FILLER]
    xb = [_ROLE.get(w, w) for w in b if w in sa and w not in _FILLER]
    return xa, xb, *_common_ends(xa, xb)


def _common_ends(a: list[str], b: list[str]) -> tuple[int, int]:
    """Lengths of the common prefix and of the common suffix after it."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return i, j


def _block_move(xa: list[str], xb: list[str], i: int, j: int) -> float:
    """1 when the shared words differ by one moved block ("in 1989 in Germany" / "in Germany in
    1989", a phrase fronted): a rotation of the differing middle (which may start one word
    earlier or end one later: "in" is common to both ends of that swap). Swapping two names
    around a verb or a preposition ("X beat Y" / "Y beat X") needs two moves, so it is not one."""
    if len(xa) != len(xb) or i + j >= len(xa) - 1 or sorted(xa) != sorted(xb):
        return 0.0
    for lo, hi in ((i, j), (i - 1, j), (i, j - 1)):
        if lo < 0 or hi < 0:
            continue
        ma, mb = xa[lo : len(xa) - hi], xb[lo : len(xb) - hi]
        if any(ma[k:] + ma[:k] == mb for k in range(1, len(ma))):
            return 1.0
    return 0.0


def _conj_swap(xa: list[str], xb: list[str], i: int, j: int) -> float:
    """1 when the order differs only by the two sides of "and"/"or"/"vs" exchanged ("Python and
    Java" / "Java and Python")."""
    ma, mb = xa[i : len(xa) - j], xb[i : len(xb) - j]
    for k, w in enumerate(ma):
        if w in _CONJ and 0 < k < len(ma) - 1 and mb == ma[k + 1 :] + [w] + ma[:k]:
            return 1.0
    return 0.0


def _roles(words: list[str]) -> dict[str, str]:
    """Each content word's role marker: the role word right before it ("" when none)."""
    out: dict[str, str] = {}
    prev = ""
    for w in words:
        if w not in _STOP and w not in out:
            out[w] = _ROLE.get(prev, "")
        prev = w
    return out


def _role_changes(q: _Text, c: _Text) -> float:
    """Share of the content words both texts have whose role marker differs."""
    rq, rc = _roles(q.words), _roles(c.words)
    shared = [w for w in rq if w in rc]
    if not shared:
        return 0.0
    return sum(1 for w in shared if rq[w] != rc[w]) / len(shared)


# What kind of answer a question asks for: "how long" wants a duration, "why" a reason. "What"
# and "which" ask for anything, so they name no kind.
_ASKS = [
    (re.compile(r"\bhow (?:many|much)\b"), "quantity"),
    # "how many years" asks how long, "how many miles" how far: a unit says the kind too
    (
        re.compile(
            r"\bhow long\b|\bhow (?:many|much) (?:years|months|weeks|days|hours|minutes"
            r"|seconds|time)\b"
        ),
        "duration",
    ),
    (
        re.compile(r"\bhow (?:far|close)\b|\bhow many (?:miles|kilometers|km|meters|feet)\b"),
        "distance",
    ),
    (re.compile(r"\bhow old\b"), "age"),
    (re.compile(r"\bhow (?:often|frequently)\b|\bhow many times (?:a|per|each)\b"), "frequency"),
    (re.compile(r"\bhow (?:big|large|small|tall|high|heavy|deep|wide)\b"), "size"),
    (re.compile(r"\bhow (?:do|does|can|could|should|would|to|did)\b"), "method"),
    (re.compile(r"\bwhy\b|\bwhat (?:causes|caused|makes)\b|\breasons? (?:for|why)\b"), "reason"),
    (
        re.compile(
            r"\bwhen\b|\bwhat(?: is| are|'s)?(?: the)?(?: \w+)? (?:time|year|day|date|month|season|hour)\b"
        ),
        "time",
    ),
    (
        re.compile(r"\bwhat(?: is| are|'s)?(?: the)?(?: \w+)? (?:place|city|country|location)\b"),
        "place",
    ),
    (re.compile(r"\bwhat(?: is| are|'s)?(?: the)?(?: \w+)? (?:reason|cause)\b"), "reason"),
    (re.compile(r"\bwhere\b"), "place"),
    (re.compile(r"\bwho\b|\bwhom\b"), "person"),
]


@lru_cache(maxsize=16384)
def _asks(lower: str) -> frozenset[str]:
    return frozenset(kind for pattern, kind in _ASKS if pattern.search(lower))


def _asks_differ(q: _Text, c: _Text) -> float:
    """1 when both questions name the kind of answer they want and no kind is shared."""
    a, b = _asks(q.lower), _asks(c.lower)
    return 1.0 if a and b and not (a & b) else 0.0


def _asks_match(q: _Text, c: _Text) -> float:
    """1 when both name the kind of answer they want and a kind is shared ("When is..." / "What
    is the best time...": other question words, one ask)."""
    return 1.0 if _asks(q.lower) & _asks(c.lower) else 0.0


def _and_or_swap(q: _Text, c: _Text) -> float:
    """1 when one joins with "and" where the other joins with "or" (a filter's logic)."""
    qa, qo = "and" in q.words, "or" in q.words
    ca, co = "and" in c.words, "or" in c.words
    return 1.0 if (qa and not qo and co and not ca) or (qo and not qa and ca and not co) else 0.0


def features(query: str, candidate: str, cosine: float) -> list[float]:
    """The feature vector (order of FEATURES) for one pair."""
    q, c = _text(query), _text(candidate)
    qset, cset = set(q.words), set(c.words)
    qc, cc = set(q.content), set(c.content)
    only_q, only_c = len(qc - cc), len(cc - qc)
    word_j = _jaccard(qset, cset)
    bigram_j = _jaccard(q.bigrams, c.bigrams)
    longest = max(len(q.words), len(c.words), 1)
    numbers_differ = sorted(q.numbers) != sorted(c.numbers)
    direction_flip = (
        q.direction is not None
        and c.direction is not None
        and q.direction == c.direction[::-1]
        and q.direction[0] != q.direction[1]
    )
    order = _shared_order(q.words[:_ORDER_WORDS], c.words[:_ORDER_WORDS])
    guard = guards.each_alone(query, candidate)
    return [
        cosine,
        word_j,
        _jaccard(qc, cc),
        _jaccard(q.char3, c.char3),
        bigram_j,
        word_j - bigram_j,
        _lcs(q.words[:_ORDER_WORDS], c.words[:_ORDER_WORDS]) / min(longest, _ORDER_WORDS),
        _discordant(q.words[:_ORDER_WORDS], c.words[:_ORDER_WORDS]),
        min(len(q.words), len(c.words)) / longest,
        float(only_q),
        float(only_c),
        float(max(only_q, only_c)),
        float(min(only_q, only_c)),
        float(numbers_differ),
        float(not numbers_differ and q.numbers != c.numbers),
        # counts, not presence: "without my phone if I have" / "...if I don't have" differ
        float(q.negations != c.negations),
        _antonym(q, c),
        float(q.operators != c.operators),
        float(direction_flip),
        float(_entities_missing(q, c)),
        _entity_order(q, c),
        float(q.passive != c.passive),
        float(guard["numbers"]),
        float(guard["negation"]),
        float(guard["entities"]),
        float(guard["entity_order"]),
        float(longest),
        _block_move(*order),
        _conj_swap(*order),
        _role_changes(q, c),
        _asks_differ(q, c),
        _asks_match(q, c),
        _and_or_swap(q, c),
    ]
