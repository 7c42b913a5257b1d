"""Semantic cache: serve a stored answer to a question asked in other words.

Only the last user message is compared by meaning, and only against entries of the same
namespace: tenant + model alias + a hash of everything before that message (system prompt, earlier
turns, and any output-shaping request fields the caller passes). "What about in winter?" after a
talk about Norway therefore never matches the same words after a talk about Peru.

Retrieval by embedding finds the most similar cached questions of the namespace; a candidate is
served only when the verifier (a pair classifier, `verifier.py`) judges it the same question, or,
with `matcher: guards`, when its cosine reaches the threshold and the near-miss guards find no
difference. Embedding, search, verification and every index change run on one worker thread (see
`async_embedder`); Redis persistence and pub/sub between replicas are optional and never raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson

from gateway.cache import guards
from gateway.cache.async_embedder import AsyncEmbedder, EmbedderBusy, JobFailed, More
from gateway.cache.context_index import context_keys
from gateway.cache.embedder import make_embedders, solo_embedder
from gateway.cache.semantic_index import Entry, SemanticIndex
from gateway.cache.semantic_settings import GUARDS_THRESHOLD, GuardSettings, SemanticSettings
from gateway.cache.semantic_store import RedisSemanticStore, entry_id_for
from gateway.cache.shared_context import clauses, differing_clauses, has_clauses
from gateway.cache.verifier import Verifier, default_verifier
from gateway.infra.hub import RedisHub
from gateway.infra.redis_client import AnyRedis
from gateway.infra.tasks import stop_task

log = logging.getLogger(__name__)

Outcome = Literal["hit", "miss", "rejected", "skipped"]
Vectors = np.ndarray | None
_MEMO_ENTRY_BYTES = 4 * 384 + 200  # a memoised vector, its key reference and LRU slot
#: The tokenizer's longest word (`max_input_chars_per_word`); a longer one is one [UNK] token.
_LONGEST_WORD = 100
#: Clauses of a question embedded ahead, from its end (`AsyncEmbedder.warm`).
_WARM_CLAUSES = 4


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """Text of the final message when it is a user message made only of text, else None.

    Images, audio or a trailing assistant/tool message make the request not semantically
    cacheable: their meaning is not in the text we would embed.
    """
    if not messages:
        return None
    last = messages[-1]
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content.strip() or None
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                return None
            parts.append(str(part.get("text", "")))
        text = "\n".join(parts).strip()
        return text or None
    return None


def namespace_for(
    tenant: str,
    alias: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any] | None = None,
) -> str:
    """Namespace of a request: tenant, model alias, and a hash of the context of its last turn.

    The context is every message but the last one (system prompt and earlier turns), the last
    one's fields besides its text, plus `params`:
    request fields that change the answer (e.g. tools, response_format, temperature); pass them so
    a JSON-mode answer is never served to a plain request.
    """
    doc: dict[str, Any] = {"m": list(messages[:-1]), "p": dict(params) if params else None}
    # The asked turn's own fields besides its text (its `name`: "What is my name?" from alice
    # is not bob's question); left out when there are none, so the usual namespace is unchanged.
    last = messages[-1] if messages else {}
    extra = {k: v for k, v in last.items() if k not in ("role", "content")}
    if extra:
        doc["l"] = extra
    context = orjson.dumps(
        doc,
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
        default=str,
    )
    digest = hashlib.blake2b(context, digest_size=12).hexdigest()
    return f"{tenant}\x1f{alias}\x1f{digest}"


@dataclass(frozen=True, slots=True)
class SemanticHit:
    entry_id: str
    similarity: float
    response: bytes
    question: str
    """The cached question whose answer is served."""


@dataclass(frozen=True, slots=True)
class SemanticLookup:
    """What a lookup found, for the response and for metrics.

    outcome: "hit"; "miss" (nothing above the threshold); "rejected" (candidates above the threshold
    were all refused; `reason`: "verifier", or the guard that refused the most similar one);
    "skipped" (`reason`:
    disabled, no_text, too_long, busy, error).
    """

    outcome: Outcome
    hit: SemanticHit | None = None
    reason: str | None = None
    similarity: float | None = None
    """Similarity of the most similar candidate, served or not (None when there was none)."""
    vector: np.ndarray | None = None
    """Embedding of the looked-up text: pass it to `store` to avoid embedding twice."""


#: What a step of a lookup on the worker thread gives: the result, or its next step.
Found = SemanticLookup | More


@dataclass(slots=True)
class _Judged:
    """A lookup's candidates for the verifier: each judged on its whole text (None), or, sharing
    a dominant context with the question, on the clauses the two differ in (one of them empty:
    a clause one text lacks altogether, never the same question)."""

    text: str
    best: float | None
    vector: np.ndarray
    candidates: list[tuple[float, Entry, tuple[str, str] | None]]

    def clauses(self) -> list[tuple[str, str]]:
        """The clause pairs to embed, each once."""
        return list(dict.fromkeys(c for *_, c in self.candidates if c is not None and all(c)))


class SemanticCache:
    """Namespaced semantic cache; memory only, or shared through Redis when `redis` is given."""

    def __init__(
        self,
        settings: SemanticSettings | None = None,
        *,
        redis: AnyRedis | None = None,
        worker: AsyncEmbedder | None = None,
        clock: Callable[[], float] = time.time,
        hub: RedisHub | None = None,
    ) -> None:
        """`hub`: the process's Redis owner, whose subscription loop brings other replicas'
        entries (without it, one borrowing `redis` is made)."""
        self.settings = settings or SemanticSettings()
        s = self.settings
        self._own_worker = worker is None
        # The vector memo counts against max_bytes too; it is dropped when it would take over a
        # quarter of a small bound.
        memo = s.vector_memo if s.vector_memo * _MEMO_ENTRY_BYTES <= s.max_bytes // 4 else 0
        if worker is None:
            embedders = make_embedders(s.embedder, s.workers)
            worker = AsyncEmbedder(
                embedders,
                s.batch_max,
                s.queue_max,
                memo,
                solo=solo_embedder(embedders[0], s.solo_cores),
                solo_cores=s.solo_cores,
            )
        self.worker = worker
        self.index = SemanticIndex(
            self.worker.dim, s.max_entries, s.max_bytes - memo * _MEMO_ENTRY_BYTES
        )
        self.verifier: Verifier | None = default_verifier() if s.matcher == "verifier" else None
        self._verifier_threshold = (
            s.verifier_threshold
            if s.verifier_threshold is not None
            else (self.verifier.threshold if self.verifier is not None else 1.0)
        )
        self.origin = uuid.uuid4().hex[:12]
        self._clock = clock
        self.store_backend = (
            RedisSemanticStore(
                redis,
                prefix=s.redis_prefix,
                channel=s.redis_channel,
                model_id=self.worker.embedder.model_id,
                origin=self.origin,
                retry_s=s.redis_retry_s,
                timeout_s=s.redis_timeout_s,
                hub=hub,
            )
            if redis is not None
            else None
        )
        self._listener: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[bool]] = set()
        self.stored = 0
        self.context_hits = 0
        """Hits judged by their own clause, found by the context they share (`context_index`)
        without embedding the whole question."""
        self.refused: dict[str, int] = {}
        """Stores refused, by reason: busy (queue full), too_long, too_big, error."""
        self.ready = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, wait_s: float = 60.0) -> None:
        """Subscribe to other replicas' entries and load the stored ones (waits up to wait_s)."""
        if self.store_backend is None:
            self.ready.set()
            return
        if self._listener is None:
            self._listener = asyncio.create_task(
                self.store_backend.listen(self._add_remote, self._rescan, self.ready),
                name="semantic-cache-subscriber",
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready.wait(), wait_s)

    async def aclose(self) -> None:
        await self.flush()
        if self._listener is not None:
            await stop_task(self._listener)
            self._listener = None
        if self._own_worker:
            await self.worker.aclose()

    # -- the request path --------------------------------------------------------------------
    async def lookup(
        self,
        namespace: str,
        text: str,
        threshold: float | None = None,
        guard_settings: GuardSettings | None = None,
    ) -> SemanticLookup:
        """Find a cached answer for `text` in `namespace`. Never raises."""
        s = self.settings
        if not s.enabled:
            return SemanticLookup("skipped", reason="disabled")
        if not text:
            return SemanticLookup("skipped", reason="no_text")
        if len(text) > s.max_tokens * 8:
            return SemanticLookup("skipped", reason="too_long")
        if not self.index.has_namespace(namespace):
            # Nothing cached in this context (every new conversation is a new namespace): a miss
            # without embedding; the store embeds later, after the response has gone.
            return SemanticLookup("miss", reason="empty_namespace")
        gs = guard_settings or s.guards
        verifier = self.verifier
        if threshold is not None:
            limit = threshold
        elif s.threshold is not None:
            limit = s.threshold
        else:
            limit = verifier.retrieval_floor if verifier is not None else GUARDS_THRESHOLD

        # A threshold of the policy or the caller bounds the whole texts' cosine, which only
        # the whole-text search computes.
        by_context = (
            verifier is not None
            and s.context_groups
            and threshold is None
            and s.threshold is None
            and self.index.contexts.has_namespace(namespace)
            and has_clauses(text)
        )

        def search_with(ahead: threading.Event | None) -> Callable[[Vectors], Found]:
            def search(vectors: Vectors) -> Found:
                assert vectors is not None
                if self._over_length(text):
                    return SemanticLookup("skipped", reason="too_long")
                found = self._match(namespace, text, vectors[0].copy(), limit, gs)
                return self._judge_clauses(found, ahead) if isinstance(found, _Judged) else found

            return search

        if by_context:
            # A cached question of this namespace shares its context with others: this one
            # may too, and is then first judged by its own clause, without embedding the whole
            # text (`context_index`); the whole text's search follows when that serves nothing.
            texts, then = [], self._by_context(namespace, text, search_with)
        else:
            texts, then = [text], search_with(self._warm_clauses(text, min_idle=2))
        try:
            found = await self.worker.submit(texts, then)
            assert isinstance(found, SemanticLookup)  # the worker follows every `More`
            return found
        except EmbedderBusy:
            return SemanticLookup("skipped", reason="busy")
        except JobFailed:  # logged on the worker thread
            return SemanticLookup("skipped", reason="error")
        except Exception:
            log.exception("semantic cache lookup failed")
            return SemanticLookup("skipped", reason="error")

    def _match(
        self, namespace: str, text: str, vector: np.ndarray, limit: float, gs: GuardSettings
    ) -> SemanticLookup | _Judged:
        """Runs under the index lock: search, then judge the candidates above the threshold.

        The verifier scores every candidate within `judge_margin` of the closest and the most
        probable one that passes is served (in a crowded namespace the closest vector is not
        always the same question); the guards take the first candidate, by similarity, that
        none of them refuses.
        """
        found = self.index.search(namespace, vector, self.settings.top_k, self._clock())
        best = found[0][0] if found else None
        if self.verifier is not None and best is not None:
            # far below the closest: never the one served (`judge_margin`), not worth judging
            limit = max(limit, best - self.settings.judge_margin)
        candidates = [(sim, entry) for sim, entry in found if sim >= limit]
        if not candidates:
            return SemanticLookup("miss", similarity=best, vector=vector)
        # Parts the model's vocabulary cannot read are one [UNK] token each: "What does 😀
        # mean?" and "What does 😭 mean?", or two Thai questions, got one vector (cosine 1.0)
        # and were served each other's answers. A candidate must have the same unreadable
        # parts as the question, in the same order.
        unknown = self._unknown(text)
        candidates = [(sim, e) for sim, e in candidates if self._unknown(e.text) == unknown]
        if not candidates:
            return SemanticLookup(
                "rejected", reason="unknown_tokens", similarity=best, vector=vector
            )
        sim, entry = candidates[0]
        if entry.text == text:
            # Asked again verbatim, and the closest candidate: the verifier gives it 1.0, which
            # no other candidate can beat (clauses included), and no guard refuses a text
            # against itself. Judging the others (under the index lock) changed nothing.
            return self._hit(sim, entry, vector)
        if self.verifier is not None:
            by = [(sim, e, differing_clauses(text, e.text)) for sim, e in candidates]
            judged = _Judged(text, best, vector, by)
            if judged.clauses():
                # Their clauses are embedded after this, outside the index lock (which every
                # worker's lookup takes): embedding them here had serialised all lookups.
                return judged
            return self._pick(judged, {})
        chosen: tuple[float, Entry] | None = None
        first_reason = None
        for sim, entry in candidates:
            refused = guards.check(text, entry.text, gs)
            if refused is None:
                chosen = (sim, entry)
                break
            first_reason = first_reason or refused
        if chosen is None:
            reason = first_reason or "guards"
            return SemanticLookup("rejected", reason=reason, similarity=best, vector=vector)
        return self._hit(*chosen, vector)

    def _warm_clauses(self, text: str, min_idle: int) -> threading.Event | None:
        """A question of several clauses may share a dominant context with a candidate, which is
        then judged by the clauses they differ in: an idle thread embeds this side's now, beside
        the question, instead of after it. The last few only: a long context comes first and
        the question last, and the thread must be free again soon. Under load no thread is idle:
        the clauses are not even worked out (10% of the hits/s of verbatim repeats,
        in-process)."""
        if self.verifier is None or not self.worker.can_warm(min_idle):
            return None
        return self.worker.warm(clauses(text)[-_WARM_CLAUSES:], min_idle)

    def _by_context(
        self,
        namespace: str,
        text: str,
        whole: Callable[[threading.Event | None], Callable[[Vectors], Found]],
    ) -> Callable[[Vectors], Found]:
        """A lookup's first step (under the index lock) when its namespace has groups of shared
        context: the groups this text would join, if any exists, and then its own clause in each
        embedded (outside the lock) and judged against their nearest members. `whole(ahead)`,
        the search by the whole text's vector, runs next when none is served."""

        def find(_: Vectors) -> Found:
            if self._over_length(text):
                return SemanticLookup("skipped", reason="too_long")
            same = self.index.get(entry_id_for(namespace, text), self._clock())
            if same is not None and same.text == text:
                # asked again verbatim: what the search would serve (`_match`), unembedded
                return self._hit(1.0, same, None)
            parts = clauses(text)
            found = [
                (i, key)
                for i, key in context_keys(namespace, parts)
                if self.index.contexts.has(key)
            ]
            if not found:
                # this thread embeds the text next: one other idle is enough to warm
                return More([text], whole(self._warm_clauses(text, min_idle=1)))

            def judge(vectors: Vectors) -> Found:
                assert vectors is not None
                served = self._judge_by_context(namespace, text, parts, found, vectors)
                # the clause's vector is in the memo now, for the whole text's judging
                return served if served is not None else More([text], whole(None))

            return More([parts[i] for i, _ in found], judge)

        return find

    def _judge_by_context(
        self,
        namespace: str,
        text: str,
        parts: list[str],
        found: list[tuple[int, int]],
        vectors: np.ndarray,
    ) -> SemanticLookup | None:
        """Under the index lock: the members nearest this text's clause in each group `found`
        (as `_match` takes candidates: within `judge_margin` of the closest, above the
        verifier's floor), each judged by the clause pair that the whole-text search would have
        it judged by, and the most probable one served; None when none passes."""
        assert self.verifier is not None
        s = self.settings
        now = self._clock()
        near = [
            (sim, entry, i)
            for row, (i, key) in enumerate(found)
            for sim, entry in self.index.search_context(key, vectors[row], s.top_k, now)
            if entry.namespace == namespace  # a hash names a group, it proves nothing
        ]
        if not near:
            return None
        limit = max(self.verifier.retrieval_floor, max(n[0] for n in near) - s.judge_margin)
        unknown = self._unknown(text)
        pairs: list[tuple[str, str, float]] = []
        judged: list[Entry] = []
        for sim, entry, i in sorted(near, key=lambda n: -n[0]):
            if not sim >= limit:  # NaN too
                continue
            theirs = clauses(entry.text)
            # Only where the two differ in that clause alone, word for word: the pair the
            # whole-text search judges them by (`_match`), not a hash's say-so.
            if len(theirs) != len(parts) or differing_clauses(text, entry.text) != (
                parts[i],
                theirs[i],
            ):
                continue
            if self._unknown(entry.text) != unknown:
                continue
            pairs.append((parts[i], theirs[i], sim))
            judged.append(entry)
        chosen = self._most_probable(pairs, judged)
        if chosen is None:
            return None
        self.context_hits += 1
        return self._hit(*chosen, None)

    def _most_probable(
        self, pairs: list[tuple[str, str, float]], entries: list[Entry]
    ) -> tuple[float, Entry] | None:
        """The entry whose pair (question, its text or clause, cosine) the verifier finds most
        probable, at or above the threshold, with that pair's cosine: the similarity a hit
        reports is that of the texts judged (the clauses, where a shared context decided)."""
        assert self.verifier is not None
        top, chosen = -1.0, None
        probabilities = self.verifier.pair_probabilities(pairs)
        for (_, _, cosine), entry, p in zip(pairs, entries, probabilities, strict=True):
            if p >= self._verifier_threshold and p > top:
                top, chosen = p, (cosine, entry)
        return chosen

    def _hit(self, sim: float, entry: Entry, vector: np.ndarray | None) -> SemanticLookup:
        self.index.touch(entry.entry_id)
        hit = SemanticHit(entry.entry_id, sim, entry.response, entry.text)
        return SemanticLookup("hit", hit, similarity=sim, vector=vector)

    def _pick(self, judged: _Judged, cosines: Mapping[tuple[str, str], float]) -> SemanticLookup:
        """Under the index lock: the most probable candidate at or above the threshold. Every
        candidate is judged in one walk of the verifier's trees, whether on its whole text or
        on its clauses (four pairs in one walk: 0.20 ms in a tight loop; four walks: 0.36)."""
        assert self.verifier is not None
        floor = self.verifier.retrieval_floor
        pairs: list[tuple[str, str, float]] = []
        entries: list[Entry] = []
        for sim, entry, differing in judged.candidates:
            if differing is None:
                pairs.append((judged.text, entry.text, sim))
            elif not all(differing) or not cosines[differing] >= floor:  # NaN too
                continue
            else:
                # A pair sharing a dominant context: with the context the same word for word,
                # the clauses they differ in are the question. Judging the whole texts let
                # different questions after one long preamble through, and refused most
                # rewordings (the model knows short questions).
                pairs.append((*differing, cosines[differing]))
            entries.append(entry)
        chosen = self._most_probable(pairs, entries)
        if chosen is None:
            return SemanticLookup(
                "rejected", reason="verifier", similarity=judged.best, vector=judged.vector
            )
        return self._hit(*chosen, judged.vector)

    def _judge_clauses(self, judged: _Judged, ahead: threading.Event | None) -> More:
        """The follow-up for candidates judged by their clauses: the worker embeds the clauses
        they differ in (each text once, outside the index lock, from the memo where it can:
        `ahead` warms the question's), then picks under the lock."""
        pairs = judged.clauses()
        texts = sorted({t for pair in pairs for t in pair})
        row = {t: i for i, t in enumerate(texts)}

        def pick(vectors: np.ndarray) -> SemanticLookup:
            return self._pick(
                judged, {(a, c): float(vectors[row[a]] @ vectors[row[c]]) for a, c in pairs}
            )

        return More(texts, pick, ahead)

    def _unknown(self, text: str) -> tuple[str, ...]:
        """The parts of `text` the model reads as [UNK] (`Embedder.unknown_pieces`). Every
        printable ASCII character is in the vocabulary: an ASCII text has one only in a word
        longer than the tokenizer reads (100 characters), so most texts need no tokenizing."""
        if text.isascii() and max(map(len, text.split()), default=0) <= _LONGEST_WORD:
            return ()
        return self.worker.embedder.unknown_pieces(text)

    def _over_length(self, text: str) -> bool:
        """More tokens than the model sees: the rest would be cut off, and texts differing
        only there would get one vector. An ASCII text has at most one token per character
        (plus two markers); any other may have several (Hangul splits into jamo), so it is
        counted whatever its length."""
        limit = self.settings.max_tokens
        if len(text) < limit - 2 and text.isascii():
            return False
        return self.worker.embedder.count_tokens(text) > limit

    async def store(
        self,
        namespace: str,
        text: str,
        response: bytes,
        ttl_s: float | None = None,
        vector: np.ndarray | None = None,
        wait_s: float = 0.0,
    ) -> bool:
        """Cache `response` as the answer to `text`; False when refused. Never raises.

        Every refusal is counted in `refused` by reason. With `wait_s` > 0 a full embedding
        queue is waited on (back-pressure) instead of refusing the store at once.
        """
        s = self.settings
        if not s.enabled:
            return False
        if not text or len(text) > s.max_tokens * 8:
            return self._refuse("too_long" if text else "no_text")
        ttl = s.ttl_s if ttl_s is None else ttl_s
        now = self._clock()
        entry_id = entry_id_for(namespace, text)
        texts = [] if vector is not None else [text]

        def add(vectors: Vectors) -> Entry | str | More:
            """The entry stored, or why it was refused; its groups of shared context next."""
            vec = vector if vector is not None else vectors[0] if vectors is not None else None
            assert vec is not None
            if self._over_length(text):
                return "too_long"
            # copy: a row view would keep the whole batch array alive as long as the entry
            entry = Entry(entry_id, namespace, text, vec.copy(), response, now + ttl)
            if not self.index.add(entry, now):
                return "too_big"
            joining = self._joining(entry)
            if not joining:
                return entry

            def join(own: Vectors) -> Entry:
                assert own is not None
                groups, at = {}, 0
                for member, keys, _ in joining:
                    groups[member] = list(zip(keys, own[at : at + len(keys)], strict=True))
                    at += len(keys)
                self.index.join(groups)
                return entry

            # their clauses embedded outside the index lock, then joined under it
            return More([t for _, _, own in joining for t in own], join)

        try:
            entry = await self.worker.submit(texts, add, wait_s=wait_s)
        except EmbedderBusy:
            return self._refuse("busy")
        except JobFailed:  # logged on the worker thread
            return self._refuse("error")
        except Exception:
            log.exception("semantic cache store failed")
            return self._refuse("error")
        if isinstance(entry, str):
            return self._refuse(entry)
        assert isinstance(entry, Entry)  # the worker follows every `More`
        self.stored += 1
        # A later question sharing this one's context is judged on the clause they differ in,
        # this side's from the memo: embedded now, on a thread that would idle, not after that
        # question's search (a long rewording's first hit: ~2-3 ms less). One idle thread is
        # enough: no job of this request's waits beside it (the store's own thread may not
        # count as idle yet).
        self._warm_clauses(text, min_idle=1)
        if self.store_backend is not None and self.store_backend.available():
            # Persist in the background: a slow or dead Redis must not delay the response.
            task = asyncio.create_task(self.store_backend.put(entry, ttl))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        return True

    async def discard(self, entry_id: str) -> bool:
        """Remove an entry (from the index, and from Redis); never raises."""
        try:
            removed: bool = await self.worker.call(lambda: self.index.remove(entry_id))
        except Exception:
            removed = False
        if self.store_backend is not None:
            await self.store_backend.delete(entry_id)
        return removed

    def _joining(self, entry: Entry) -> list[tuple[str, list[int], list[str]]]:
        """Under the index lock, just after `entry` was added: the entries that now join groups
        of shared context (`context_index`), each as (id, the keys of its groups, its own
        clauses there, to embed). A namespace's first entry joins none: most namespaces (a
        conversation each) never get a second, and two clause vectors would have doubled an
        entry of two sentences (4.1 -> 8.9 KB with an answer of 500 bytes). The second brings
        the first in; every later one joins as it comes."""
        if self.verifier is None or not self.settings.context_groups:
            return []
        pair = self.index.entries_of(entry.namespace, most=2)  # [] past two: this one alone
        if len(pair) == 1:
            return []  # the namespace's first
        members = [entry] + [e for e in pair if e.entry_id != entry.entry_id]
        out = []
        for member in members:
            if self.index.contexts.grouped(member.entry_id):
                continue
            parts = clauses(member.text)
            groups = context_keys(member.namespace, parts)
            if groups:
                out.append(
                    (member.entry_id, [key for _, key in groups], [parts[i] for i, _ in groups])
                )
        return out

    def _refuse(self, reason: str) -> bool:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return False

    async def flush(self) -> None:
        """Wait for the Redis writes still in flight (tests, shutdown)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    # -- replication -------------------------------------------------------------------------
    async def rebuild_from_redis(self) -> int:
        """Load every live entry stored in Redis into the index; returns how many were added."""
        if self.store_backend is None:
            return 0
        loaded = 0
        async for chunk in self.store_backend.scan():
            loaded += await self._add_entries(chunk)
        return loaded

    async def _rescan(self) -> None:
        count = await self.rebuild_from_redis()
        log.info("semantic cache: %d entries loaded from Redis", count)

    async def _add_remote(self, entries: list[Entry]) -> None:
        try:
            await self._add_entries(entries)
        except Exception:  # a full queue must not drop the subscription
            log.warning("semantic cache: dropped %d replicated entries", len(entries))

    async def _add_entries(self, entries: list[Entry]) -> int:
        def add_all() -> int:
            now = self._clock()
            count = 0
            for entry in entries:
                if entry.expires_at > now:
                    self.index.add(entry, now)
                    count += 1
            return count

        while True:
            try:
                return await self.worker.call(add_all)
            except EmbedderBusy:  # lookups fill the queue: wait for room, keep the entries
                await asyncio.sleep(0.01)

    def stats(self) -> dict[str, int]:
        """Sizes and counters for metrics (approximate: read without the worker)."""
        return {
            "entries": len(self.index),
            "namespaces": self.index.namespaces,
            "bytes": self.index.nbytes,
            "evicted": self.index.evicted,
            "expired": self.index.expired,
            "redis_errors": self.store_backend.errors if self.store_backend else 0,
            "invalid": self.store_backend.invalid if self.store_backend else 0,
            "other_model": self.store_backend.other_model if self.store_backend else 0,
            "stored": self.stored,
            "embedded": self.worker.embedded,
            "memo_hits": self.worker.memo_hits,
            "warmed": self.worker.warmed,
            "solo": self.worker.solo_texts,
            "context_hits": self.context_hits,
        }
