"""Settings of the semantic cache (a policy block ops can edit)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: Cosine threshold of the "guards" matcher (chosen on loadtests/data/chat_pairs.tsv with all guards).
GUARDS_THRESHOLD = 0.88


class GuardSettings(BaseModel):
    """Near-miss guards run on a candidate that passed the similarity threshold."""

    model_config = ConfigDict(extra="forbid")

    numbers: bool = True
    """Reject when the two questions mention different numbers (digits or number words)."""
    negation: bool = True
    """Reject when one question is negated (not, no, never, n't, without...), the other not."""
    entities: bool = True
    """Reject when a named entity of one question is absent from the other."""
    entity_order: bool = True
    """Reject when shared entities appear in another order ("X beat Y" vs "Y beat X")."""


#: Default of `SemanticSettings.judge_margin` (the offline protocol `SharedTune` uses it too).
JUDGE_MARGIN = 0.10


class SemanticSettings(BaseModel):
    """How the semantic cache matches, evicts and persists entries."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    matcher: Literal["verifier", "guards"] = "verifier"
    """How a retrieved candidate is judged. "verifier": a pair classifier (gateway/cache/verifier.py,
    trained on public paraphrase data) decides whether the two questions are the same question;
    "guards": cosine threshold plus the lexical near-miss guards (the earlier design)."""
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Minimum cosine similarity for a candidate. None: the verifier's retrieval floor (0.60)
    with the verifier, 0.88 with the guards."""
    verifier_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Probability the verifier needs to serve a candidate; None: the model's own (chosen on its
    tune split, see loadtests/train_verifier.py). Higher: fewer false hits, fewer hits."""
    ttl_s: float = Field(default=3600.0, gt=0)
    """Default lifetime of an entry (memory and Redis)."""
    max_entries: int = Field(default=100_000, ge=1)
    """Memory bound over all namespaces; the least recently used entries go first."""
    max_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    """Memory bound on vectors + texts + stored responses, over all namespaces."""
    max_tokens: int = Field(default=256, ge=8, le=256)
    """Longer questions are not cached: the model would only see their first 256 tokens, so
    two questions that differ after that point would look identical."""
    top_k: int = Field(default=4, ge=1, le=64)
    """Candidates above the threshold tried in turn when the best one is refused."""
    judge_margin: float = Field(default=JUDGE_MARGIN, ge=0.0, le=1.0)
    """With the verifier: candidates whose cosine is more than this below the closest one's are
    not judged. In a namespace of look-alike questions all four candidates pass the retrieval
    floor, and judging them was a sixth of a hit's CPU; on the tune split a candidate that far
    below the closest was never the one served (right answers the same with 0.10 as with all
    four; BENCHMARKS.md, semantic cache speed)."""
    context_groups: bool = True
    """With the verifier: cached questions of several clauses are grouped by the context they
    share word for word (all but their first clause, all but their last), and a new question
    found in a group is judged by its own clause without embedding the whole text
    (`context_index`; a ~36-token question costs twice its clause). Each such entry of a
    namespace holding two or more keeps two clause vectors more, counted against `max_bytes`,
    embedded after its store (a namespace's lone entry joins no group)."""
    guards: GuardSettings = Field(default_factory=GuardSettings)
    """Used by the "guards" matcher only: with the verifier they are among its features, and a
    veto on top of it lowered hits more than false hits on every set measured."""
    embedder: Literal["auto", "torch", "onnx", "onnx-packaged"] = "auto"
    """"auto": onnx when installed, else torch. "onnx" runs the dynamic-int8 build of the packaged
    model (built once per machine, about half the time per query); "onnx-packaged" the packaged
    model as it is (fp32 speed, vectors interchangeable with torch's)."""
    workers: int = Field(default=2, ge=1, le=16)
    """Embedding threads, each with its own model session. Two on a 2-core machine: 341 vs 187
    short-question hits/s with 16 clients, measured side by side on an idle machine (BENCHMARKS.md,
    semantic cache throughput); under load from other processes the two were within noise."""
    solo_cores: int = Field(default=2, ge=1, le=16)
    """A job embedded while no other is in flight or waiting, and this many of the machine's
    cores are free, may run its model call on that many cores (a second model session sharing
    the first's weights, ONNX only), where that has been measured faster (`gateway/cache/solo.py`):
    the same vector, a lone lookup 1.1-1.6 ms sooner through HTTP (BENCHMARKS.md). 1: every job
    on one core."""
    batch_max: int = Field(default=8, ge=1)
    """Most queued texts embedded together in one model call."""
    vector_memo: int = Field(default=4096, ge=0)
    """Vectors of this many recent texts kept (~1.7 KB each) so a question asked again verbatim,
    in any conversation, is not embedded again."""
    lookup_budget_ms: float = Field(default=0.0, ge=0)
    """When > 0, a request waits at most this long for its lookup; past it the request goes
    upstream (counted as a "late" lookup) and the lookup's vector is still used for the store.
    Bounds what a miss costs when the embedder is backed up. 0: always wait."""
    race_unrelated: bool = True
    """A question sharing no content word with any question cached in its context
    (`gateway/cache/word_gate.py`) starts its upstream call at once and races its lookup, which
    still serves a hit that comes first (the call then cancelled): such a question is nearly
    always a miss, and a miss then does not wait for its embedding. Only where the route's
    upstream has answered (a stream: sent its first chunk) in more than twice a lookup's time
    (EWMAs, streams timed apart), so that the lookup still answers first and no hit is lost.
    Counted as "early" lookups. An alias's `cache.semantic.race_all` races every lookup."""
    race_rare_hits: float = Field(default=0.05, ge=0.0, le=1.0)
    """A question not asked lately (its vector not in the memo: the lookup must embed it) is
    raced the same way while, on its route, fewer than this share of such lookups found an
    answer (the mean of the last ~50, once 20 were seen; raced lookups count too). There a wait
    is nearly always spent on a miss, and racing costs an upstream call started and cancelled
    for at most about this share of the raced questions. A question asked again verbatim (in
    the memo: no embedding, a lookup of ~1 ms) still waits. 0: off."""
    queue_max: int = Field(default=256, ge=1)
    """Jobs waiting for the embedding thread; beyond this a lookup is a miss ("busy")."""
    refresh_wait_s: float = Field(default=10.0, ge=0, le=60)
    """A `Cache-Control: no-cache` refresh waits up to this long for room in the embedding queue
    to store its answer (and its response waits for that store): back-pressure, not a drop."""
    redis_prefix: str = "gw:sem:"
    redis_channel: str = "gw:sem:new"
    redis_timeout_s: float = Field(default=1.0, gt=0)
    """Longest wait for one Redis write (writes run in the background, never on a request)."""
    redis_retry_s: float = Field(default=5.0, ge=0)
    """After a Redis error, Redis is skipped for this long (no connection storm, no added
    latency per request); the cache keeps working from memory."""


class SemanticRoute(BaseModel):
    """Per-alias switch and overrides; the engine itself is configured by `SemanticSettings`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """None = the gateway-wide threshold (chosen by loadtests/semantic_quality.py)."""
    ttl_s: float | None = Field(default=None, gt=0)
    allow_nonzero_temperature: bool = False
    """Serve similar questions' answers to sampled (temperature > 0) requests too."""
    race_all: bool = False
    """Race every lookup of this alias against its upstream call, not only those of unrelated
    questions (`semantic_cache.race_unrelated`), where the upstream has answered in more than
    twice a lookup's time: no miss waits for its embedding, and a hit is still served first, but
    each hit costs one upstream call started and cancelled (a provider may bill its prompt).
    For interactive aliases in front of upstreams you run yourself."""
