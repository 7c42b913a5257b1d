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
from gateway.cache.semantic_settings import GuardSettings

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
_OFF = GuardSettings(numbers=False, negation=False, entities=False, entity_order=False)
_GUARD_ONLY = {
    name: _OFF.model_copy(update={name: True})
    for name in ("numbers", "negation", "entities", "entity_order")
}


#: Order features (quadratic) look at the first words only: a cached question is at most
#: max_tokens long, and 600-word texts would cost ~100 ms a pair uncapped.
_ORDER_WORDS = 64


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


class _Text:
    __slots__ = ("bigrams", "char3", "compact", "content", "lower", "negations", "numbers",
                 "operators", "raw", "words", "entities", "direction", "flat",
                 "passive", "members", "data_units")  # fmt: skip

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
        self.members = _members(words)
        self.data_units = _data_units(raw)


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


_SPACING = re.compile(r"[\s?!.,;:]+")


def identical(query: str, candidate: str) -> bool:
    """The same text but for case, spacing and sentence punctuation (operators count), and
    no unit in bits on one side and in bytes on the other ("Mbps" / "MBps")."""
    if _SPACING.sub(" ", query.lower()).strip() != _SPACING.sub(" ", candidate.lower()).strip():
        return False
    return query == candidate or not _bits_bytes(_text(query), _text(candidate))


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
    guard = {
        name: guards.check(query, candidate, gs) is not None for name, gs in _GUARD_ONLY.items()
    }
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


# -- near-miss rules: vetoes on top of the trees ---------------------------------------------------
# Hand-written near misses of domains the model never saw were served where one question is the
# other plus a modifier ("snake plants need water" / "... in winter", "tight hips" / "... for
# runners") or names another member of one small set ("a white cat" / "a black cat", "in winter"
# / "in summer", "a female guest" / "a man"): the embedding and the word overlap both say
# "the same", and no feature says what was added. On the tune splits these two rules refused
# 11 of 43 served negatives of the new domains and 2 of 50 of the older ones, and no served
# paraphrase of either or of PAWS (loadtests/near_miss_report.py, BENCHMARKS.md). Two more
# followed a probe of the kinds (loadtests/data/kinds_probe.tsv): two names exchanged
# ("from my savings to my checking" reversed, which the trees served at 0.72) and operators moved
# (`i++` / `++i`: the words the features read are the same); on every train and tune pair they
# refused no chat paraphrase and 5 of PAWS's, against 282 and 54 negatives. A second probe
# (kinds_probe_2.tsv) found two more: "this year" / "last year" (a time relative to now, now a
# kind of the contrast rule) and "Mbps" / "MBps" (the uncased model and the words see one text);
# on every train and tune pair they refuse one negative more and no paraphrase. A third
# (kinds_probe_3.tsv) found another quantifier ("all" / "most" spiders, now a kind too: 4
# negatives more, no paraphrase) and the same words in another tense ("did it rain" / "will it
# rain": the "tense" rule, which no train or tune pair meets). A fourth (kinds_probe_4.tsv)
# found a person and another exchanged ("What should I say to my boss?" / "What should my boss
# say to me?": the exchange rule now reads "I", "me" and "my" as one person; 2 negatives more on
# train and tune, no paraphrase) and "both" / "either" (quantifiers). A sixth
# (kinds_probe_6.tsv) found a deadline against a start ("by April 15" / "after April 15": a
# kind, 2 negatives more, no paraphrase) and "unless" (a negation; no train or tune pair has it).
# A seventh (kinds_probe_7.tsv): "during" against "after" (a kind; 5 negatives more) and an
# exchange of words in another form ("12 volt ... watts" / "12 watt ... volts", "pints in a
# quart" / "quarts in a pint": the exchange rule also reads stems; 3 chat and 3 PAWS negatives
# more). Neither refuses a train or tune paraphrase. An eighth (kinds_probe_8.tsv): `3 / 2` /
# `3 // 2` ("//" is not a word to the features) and `*p++` / `(*p)++` (brackets): the operator
# rule also compares the words without operators, and brackets touching an operator; 3 written
# negatives more, no paraphrase (a dash of another length, "Kanpur - Delhi" / "Kanpur --
# Delhi", refused two PAWS paraphrases in a first draft).

#: Members of one kind: a pair naming two different members of a kind, each only on its side,
#: asks two questions. Kept to kinds whose members are never rewordings of each other (an
#: "evening" is a "night", a "child seat" a "baby seat": those kinds are not here).
_KINDS = {
    "colour": [["white"], ["black"], ["red"], ["blue"], ["green"], ["yellow"], ["orange"],
               ["purple"], ["pink"], ["brown"], ["grey", "gray"], ["silver"], ["gold"]],
    "season": [["spring"], ["summer"], ["autumn", "fall"], ["winter"]],
    "sex": [["man", "men", "male", "males", "guy", "guys", "boy", "boys", "husband", "father",
             "dad", "son", "gentleman", "gentlemen"],
            ["woman", "women", "female", "females", "girl", "girls", "lady", "ladies", "wife",
             "mother", "mom", "daughter"]],
    "time of day": [["morning"], ["afternoon"], ["evening", "night", "tonight"]],
    "weekday": [[d] for d in ("monday", "tuesday", "wednesday", "thursday", "friday",
                              "saturday", "sunday")],
    "month": [[m] for m in ("january", "february", "march", "april", "june", "july", "august",
                            "september", "october", "november", "december")],
    "level": [["beginner", "beginners", "novice", "novices"], ["intermediate"],
              ["advanced", "expert", "experts"]],
}  # fmt: skip
_MEMBER = {w: (kind, i) for kind, groups in _KINDS.items() for i, ws in enumerate(groups)
           for w in ws}  # fmt: skip
#: How a request to a chat model starts (after contractions are expanded): the modifier rule
#: is for such texts. Statements (PAWS's wiki sentences) add an apposition or a country to say
#: the same thing ("... from Macedonia and Thrace , Greece"): 30 served PAWS paraphrases of the
#: tune split would be refused.
_ASKING = frozenset([
    "how", "what", "which", "why", "when", "where", "who", "whom", "whose", "is", "are", "am",
    "can", "could", "do", "does", "did", "should", "will", "would", "was", "were", "any", "i",
    "my", "tips", "best", "write", "explain", "give", "list", "suggest", "recommend", "tell",
    "describe", "summarize", "summarise", "translate", "compare", "name", "show", "help", "find",
])  # fmt: skip
#: Added words that narrow nothing: adverbs of emphasis and politeness.
_NARROW_NOTHING = frozenset([
    "really", "actually", "exactly", "usually", "typically", "generally", "normally", "ever",
    "basically", "honestly", "possibly", "even", "still", "just", "thanks", "thank", "please",
    "quick", "question", "hey", "hi", "hello", "wondering", "like", "know", "curious", "asking",
    "considered", "regarded",  # "is a tomato (considered) a fruit?"
])  # fmt: skip


def _asking(t: _Text) -> bool:
    return t.raw.rstrip().endswith("?") or (bool(t.words) and t.words[0] in _ASKING)


def _adds_modifier(q: _Text, c: _Text) -> bool:
    """True when one text is the other's words, in order, plus a content word or number (a
    preamble before the shorter text's first word does not count: "Quick question: ...")."""
    if len(q.words) == len(c.words) or not (_asking(q) and _asking(c)):
        return False
    short, long = (q.words, c.words) if len(q.words) < len(c.words) else (c.words, q.words)
    if not short or len(long) > 2 * _ORDER_WORDS or short[0] not in long:
        return False
    rest = long[long.index(short[0]) :]
    it = iter(rest)
    if not all(w in it for w in short):  # a subsequence: each word found after the last one
        return False
    have = set(short)
    return any(
        w not in have and w[0].isalnum() and w not in _STOP and w not in _NARROW_NOTHING
        for w in rest
    )


#: A time said relative to now: "last year" / "this year" / "next year" are three questions.
#: Only before a word of time ("the last element" is not a time); "yesterday", "today",
#: "tomorrow" say it alone.
_RELATIVE = {"last": 0, "previous": 0, "past": 0, "this": 1, "current": 1, "next": 2,
             "coming": 2, "upcoming": 2}  # fmt: skip
_TIME_NOUNS = frozenset([
    "year", "years", "month", "months", "week", "weeks", "weekend", "weekends", "quarter",
    "quarters", "season", "semester", "term", "decade", "century", "day", "days", "night",
    "morning", "afternoon", "evening", "summer", "winter", "spring", "autumn", "fall",
    *(w for ws in _KINDS["weekday"] + _KINDS["month"] for w in ws),
])  # fmt: skip
_DEICTIC = {"yesterday": 0, "today": 1, "tonight": 1, "tomorrow": 2}
#: A deadline or a start: "by April 15" / "after April 15", before a date or a time only ("by
#: car", "after dinner" are not).
_BOUND = {"by": 0, "before": 0, "until": 0, "till": 0, "after": 1, "since": 1}
_DATE_WORDS = _TIME_NOUNS | frozenset(["noon", "midnight", "today", "tomorrow", "tonight"])
_ARTICLES = frozenset(["the", "next", "this"])
#: During something, or before or after it: "What did people eat during the war?" / "after the
#: war". Before and after are one member: "thunder comes after lightning" is "lightning comes
#: before thunder" (a converse the rule would refuse; the trees weigh "before" / "after").
_SEQUENCE = {"before": 0, "after": 0, "during": 1}
#: Not a time there: "after all", "look after", "named after", "than before", "before long".
_NOT_SEQUENCE = frozenset(["look", "looks", "looking", "looked", "named", "take", "takes", "than",
                           "ever", "never"])  # fmt: skip
#: Counts between the relative word and its time: "the last 3 years", "the next few days".
_SPAN = frozenset(["few", "couple", "several", "two", "three"])


#: How many: "all" / "every" / "each" / "both", "most", "some" / "any" / "either" / "a few", "few".
_QUANTIFIER = {"all": 0, "every": 0, "each": 0, "both": 0, "most": 1, "some": 2, "any": 2,
               "either": 2, "few": 3}  # fmt: skip
#: Not a quantifier there: "at all", "after all", "all of a sudden", "the most", "most of all".
_NOT_QUANTIFYING = frozenset(["at", "after", "above", "the", "once", "for"])


def _quantifies(words: list[str], i: int) -> bool:
    """Whether words[i] says how many: not "at all", "the most", "every day" (a time), nor a
    request's opening "Any tips?"."""
    if i == 0:
        return words[i] != "any"
    return words[i - 1] not in _NOT_QUANTIFYING and (
        i + 1 == len(words) or words[i + 1] not in _TIME_NOUNS
    )


def _word_after(words: list[str], i: int, skip: frozenset[str]) -> str:
    """The word after words[i], past up to two numbers or words of `skip` ("" at the end):
    "last [3] years", "next [few] days"."""
    j = i + 1
    while j < len(words) and j <= i + 2 and (words[j][0].isdigit() or words[j] in skip):
        j += 1
    return words[j] if j < len(words) else ""


def _sequence(words: list[str], i: int) -> bool:
    """Whether words[i] ("before", "during", "after") places something in time: not "after
    all", "before long", "look after", "named after", "than before"."""
    if i + 1 == len(words) or words[i + 1] in ("all", "long"):
        return False
    return i == 0 or words[i - 1] not in _NOT_SEQUENCE


def _members(words: list[str]) -> set[tuple[str, int]]:
    """The (kind, member) pairs a text names, times relative to now included."""
    found = {_MEMBER[w] for w in words if w in _MEMBER}
    for i, w in enumerate(words):
        if w in _QUANTIFIER:
            if _quantifies(words, i):
                few = w == "few" and i > 0 and words[i - 1] == "a"  # "a few" is "some"
                found.add(("quantifier", 2 if few else _QUANTIFIER[w]))
        elif w in _DEICTIC:
            found.add(("when", _DEICTIC[w]))
        elif w in _BOUND and i + 1 < len(words):
            nxt = words[i + 2] if words[i + 1] in _ARTICLES and i + 2 < len(words) else words[i + 1]
            if nxt[0].isdigit() or nxt in _DATE_WORDS:
                found.add(("bound", _BOUND[w]))
        elif w in _RELATIVE and _word_after(words, i, _SPAN) in _TIME_NOUNS:
            found.add(("when", _RELATIVE[w]))
        if w in _SEQUENCE and _sequence(words, i):
            found.add(("sequence", _SEQUENCE[w]))
    return found


def _contrast(q: _Text, c: _Text) -> bool:
    """True when the texts name different members of one kind, each only on its side."""
    qk, ck = q.members, c.members
    only_c = {kind for kind, _ in ck - qk}
    return any(kind in only_c for kind, _ in qk - ck)


#: Runs of the characters code writes operators with (the words see none of them).
_OPERATOR_RUN = re.compile(r"[-+*/%=<>!&|^~]+")
#: Words that coordinate: "A and B" / "B and A" asks the same thing.
_COORDINATE = _CONJ | {"nor"}
#: "born in Boston in 1923" / "born in 1923 in Boston": a phrase moved, not a role exchanged.
_PHRASE_HEADS = frozenset(["in", "on", "at", "during", "by", "with", "for"])
#: Relations that read the same both ways: "compare X with Y", "how far is X from Y", "is X
#: different from Y" ask what the exchanged question asks.
_SYMMETRIC = frozenset([
    "compare", "comparing", "comparison", "differ", "differs", "different", "difference",
    "differences", "similar", "similarities", "same", "alike", "equal", "equivalent", "far",
    "distance", "between", "relationship", "related",
])  # fmt: skip


def _operator_marks(raw: str) -> list[tuple[str, str]]:
    """Each operator run in order; an increment or decrement also with the side of the name it
    applies to: `i++` ("left") is not `++i` ("right"), while `C++20` is `C++ 20` and `5+3` is
    `5 + 3` (other spacing is style). Exclamation marks and a lone hyphen or slash between
    letters ("two-step", "and/or") are prose, not operators."""
    low = raw.lower()
    marks = []
    for m in _OPERATOR_RUN.finditer(low):
        run = m.group()
        before = low[m.start() - 1] if m.start() else " "
        after = low[m.end()] if m.end() < len(low) else " "
        if set(run) == {"!"} or (run in ("-", "/") and before.isalpha() and after.isalpha()):
            continue
        side = ""
        if run in ("++", "--"):
            if before.isalpha() or before in "_)]":
                side = "left"
            elif after.isalpha() or after == "_":
                side = "right"
        marks.append((run, side))
    return marks


#: Operators and brackets in order, and an operator touching a bracket: code's precedence.
_CODE_PUNCT = re.compile(r"[-+*/%=<>!&|^~]+|[()\[\]{}]")
_TOUCHING = re.compile(r"[()\[\]{}][-+*/%=<>&|^~]|[-+*/%=<>&|^~][()\[\]{}]")


def _operators_moved(q: _Text, c: _Text) -> bool:
    """True when the texts have the same words but other operators, or an increment on the
    other side: nothing the trees see tells them apart (`i++` / `++i`, `C++` / `C`, `3 / 2` /
    `3 // 2`), or the same operators grouped by other brackets (`*p++` / `(*p)++`)."""
    qm, cm = _operator_marks(q.raw), _operator_marks(c.raw)
    if q.words == c.words and qm != cm:
        return True
    if (
        not qm
        or not cm
        or [w for w in q.words if w[0].isalnum()] != [w for w in c.words if w[0].isalnum()]
    ):
        return False
    if len(qm) == len(cm) and _undashed(qm) != _undashed(cm):
        return True
    touching = _TOUCHING.search(q.raw) or _TOUCHING.search(c.raw)
    return bool(touching) and _CODE_PUNCT.findall(q.raw) != _CODE_PUNCT.findall(c.raw)


def _undashed(marks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A dash is a dash however long ("Kanpur - Delhi" / "Kanpur -- Delhi")."""
    return [("-", side) if not side and set(run) == {"-"} else (run, side) for run, side in marks]


#: A person however the sentence places them: "I" asks what "me" and "my" do.
_PERSON = {
    "i": "1s", "me": "1s", "my": "1s", "mine": "1s", "myself": "1s", "you": "2", "your": "2",
    "yours": "2", "yourself": "2", "he": "3m", "him": "3m", "his": "3m", "himself": "3m",
    "she": "3f", "her": "3f", "hers": "3f", "herself": "3f", "we": "1p", "us": "1p", "our": "1p",
    "ours": "1p", "ourselves": "1p", "they": "3p", "them": "3p", "their": "3p", "theirs": "3p",
}  # fmt: skip
_PERSONS = frozenset(_PERSON.values())


def _exchanged(q: _Text, c: _Text) -> bool:
    """True when two names or words (up to 4 words each), not next to each other and not
    coordinated, exchanged places and nothing else changed: "from my savings to my checking" /
    "from my checking to my savings", "Did Brazil beat Germany" / "Did Germany beat Brazil",
    "from Google Drive to Dropbox"; or a person and another ("What should I say to my boss?" /
    "What should my boss say to me?", "if I love my cat" / "if my cat loves me"). Members of a
    list (a comma between them), a phrase moved ("in Boston in 1923") and symmetric relations
    ("compare X with Y") are left to the trees."""
    a, b = q.words, c.words
    if len(a) != len(b) or a == b or len(a) > _ORDER_WORDS:
        return False
    if _swap_at(a, b, *_common_ends(a, b), q):
        return True
    # words in another form: "a 12 volt fridge ... watts" / "a 12 watt fridge ... volts"
    pa = [_PERSON.get(w) or _stem(w) for w in a]
    pb = [_PERSON.get(w) or _stem(w) for w in b]
    p, s = _common_ends(pa, pb)
    if pa != pb and _swap_at(pa, pb, p, s, q):
        return True
    if not any(w in _PERSON for w in a):
        return False
    # the person may open the part that moved: "if [I] love [my cat]" / "if [my cat] loves [me]"
    return any(
        _swap_at(pa, pb, i, j, q, _PERSONS)
        for i in range(max(0, p - 2), p + 1)
        for j in (s, max(0, s - 1))
    )


def _swap_at(
    a: list[str], b: list[str], p: int, s: int, q: _Text, among: frozenset[str] | None = None
) -> bool:
    """Whether a[p:-s] is b[p:-s] with its first and last parts exchanged (see `_exchanged`),
    one of them holding a word of `among` when given."""
    mid_a, mid_b = a[p : len(a) - s], b[p : len(b) - s]
    for lx in range(1, min(4, len(mid_a) - 2) + 1):
        for ly in range(1, min(4, len(mid_a) - lx - 1) + 1):
            x, m, y = mid_a[:lx], mid_a[lx : len(mid_a) - ly], mid_a[len(mid_a) - ly :]
            if mid_b != y + m + x or (among is not None and not among.intersection(x + y)):
                continue
            if all(w in _STOP for w in x) or all(w in _STOP for w in y):
                return False
            if any(w in _COORDINATE for w in m) or any(w in _SYMMETRIC for w in q.words):
                return False
            if p > 0 and a[p - 1] == m[-1] and m[-1] in _PHRASE_HEADS:
                return False
            first, last = q.lower.find(x[-1]), q.lower.rfind(y[0])
            return not (0 <= first < last and "," in q.lower[first:last])
    return False


#: "Did it rain on Saturday?" / "Will it rain on Saturday?": the same words in the past and in
#: the future ask two questions; the trees served such pairs (0.77-0.96) whose only change is
#: the auxiliary. Words that come with a tense ("be", "have") are left out of the comparison.
_PAST = frozenset(["did", "was", "were", "had"])
_FUTURE = frozenset(["will", "gonna"])
_WITH_TENSE = _PAST | _FUTURE | {"be", "been", "have"}


def _tense_words(t: _Text) -> tuple[set[str], list[str]]:
    tenses = {"past" if w in _PAST else "future" for w in t.words if w in _PAST or w in _FUTURE}
    return tenses, [_stem(w).rstrip("e") for w in t.words if w not in _WITH_TENSE]


def _tense_changed(q: _Text, c: _Text) -> bool:
    """True when the texts say the same words, one in the past and the other in the future."""
    qt, qw = _tense_words(q)
    ct, cw = _tense_words(c)
    return len(qt) == len(ct) == 1 and qt != ct and qw == cw


#: A data size or rate: "Mb" (bits) is not "MB" (bytes), a difference of case only, which the
#: uncased model and the lower-cased words cannot see. All lower case ("mb", "mbps") is left
#: alone: it is written for either.
_UNIT_HINT = re.compile(r"[kmgtpKMGTP]i?[bB]")
_DATA_UNIT = re.compile(r"(?<![^\W\d_])([kmgtp]i?)(b)(ps|/s)?(?![^\W_])", re.IGNORECASE)


def _data_units(raw: str) -> list[tuple[str, str, bool]]:
    if not _UNIT_HINT.search(raw):  # most texts: a quick scan, not the whole pattern
        return []
    return [
        (m.group(1).lower() + (m.group(3) or "").replace("/s", "ps").lower(), m.group(2),
         m.group().islower())
        for m in _DATA_UNIT.finditer(raw)
    ]  # fmt: skip


def _bits_bytes(q: _Text, c: _Text) -> bool:
    """True when one text says a size or rate in bits where the other says it in bytes
    ("100 Mbps" / "100 MBps", "8 Gb" / "8 GB"), each written with its case."""
    qu, cu = q.data_units, c.data_units
    if len(qu) != len(cu):
        return False
    return any(
        a[0] == b[0] and a[1] != b[1] and not a[2] and not b[2] for a, b in zip(qu, cu, strict=True)
    )


def near_miss(query: str, candidate: str) -> str | None:
    """The rule that refuses `candidate` as an answer to `query` whatever the trees say
    ("modifier", "contrast", "exchange", "operator", "tense", "unit"), or None."""
    q, c = _text(query), _text(candidate)
    if _adds_modifier(q, c):
        return "modifier"
    if _contrast(q, c):
        return "contrast"
    if _exchanged(q, c):
        return "exchange"
    if _operators_moved(q, c):
        return "operator"
    if _tense_changed(q, c):
        return "tense"
    if _bits_bytes(q, c):
        return "unit"
    return None
