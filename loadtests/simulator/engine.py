"""The timing model of one inference engine: continuous batching, prefix cache, prefill, decode.

One engine per instance, on one asyncio loop. A sequence holds one of ``max_batch`` slots from
admission to its last token; later arrivals wait in a FIFO queue. The engine only decides *when*
tokens exist; the server decides what they say.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator

from .faults import FaultInjector
from .profiles import Profile
from .text import CHARS_PER_TOKEN


class Overloaded(Exception):
    """The waiting queue is full (``max_queue``)."""


class PrefixCache:
    """LRU of chained hashes of fixed-size prompt blocks, like vLLM's automatic prefix caching.

    Block ``i`` is identified by hash(block i-1's id, text of block i), so a block only matches
    when everything before it matches too. Only whole blocks are cached.
    """

    def __init__(self, capacity_blocks: int, block_tokens: int) -> None:
        self.capacity = capacity_blocks
        self.block_chars = block_tokens * CHARS_PER_TOKEN
        self.block_tokens = block_tokens
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def block_ids(self, text: str) -> list[int]:
        size = self.block_chars
        ids, h = [], 0
        for start in range(0, len(text) - size + 1, size):
            h = hash((h, text[start : start + size]))
            ids.append(h)
        return ids

    def match(self, ids: list[int]) -> int:
        """Number of leading blocks present (and mark them recently used)."""
        n = 0
        for h in ids:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        return n

    def store(self, ids: list[int]) -> None:
        if self.capacity <= 0:
            return
        for h in ids:
            self._lru[h] = None
            self._lru.move_to_end(h)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def clear(self) -> None:
        self._lru.clear()


class Engine:
    """Slots, queue, prefix cache and timing for one instance."""

    def __init__(self, profile: Profile, faults: FaultInjector) -> None:
        self.profile = profile
        self.faults = faults
        self.cache = PrefixCache(profile.prefix_cache_blocks, profile.block_tokens)
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.cached_tokens_total = 0
        self.prefilled_tokens_total = 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a batch slot, waiting in FIFO order; raise Overloaded if the queue is full."""
        p = self.profile
        if (self.active < p.max_batch and not self._waiters) or p.zero_latency:
            self.active += 1
            return
        if p.max_queue is not None and len(self._waiters) >= p.max_queue:
            raise Overloaded
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            else:
                # release() may already have dropped this cancelled waiter from the queue.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def release(self) -> None:
        """Free a slot, handing it straight to the oldest waiter if there is one."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.active -= 1

    def lookup(self, prompt_text: str, prompt_tokens: int) -> tuple[int, list[int]]:
        """Cached prompt tokens and the prompt's block ids (to store after prefill)."""
        ids = self.cache.block_ids(prompt_text)
        cached = self.cache.match(ids) * self.cache.block_tokens
        # Like vLLM, at least the last prompt token is always computed.
        return max(0, min(cached, prompt_tokens - 1)), ids

    async def prefill(self, prompt_text: str, prompt_tokens: int) -> int:
        """Sleep for the prefill of the uncached part; return the cached token count."""
        cached, ids = self.lookup(prompt_text, prompt_tokens)
        p, f = self.profile, self.faults.faults
        compute_ms = 0.0 if p.zero_latency else p.ttft_base_ms
        if not p.zero_latency:
            compute_ms += p.prefill_ms_per_token * (prompt_tokens - cached)
        delay_ms = compute_ms * f.ttft_multiplier + f.slow_first_token_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        self.cache.store(ids)
        self.cached_tokens_total += cached
        self.prefilled_tokens_total += prompt_tokens - cached
        return cached

    def decode_rate(self) -> float:
        """Tokens/s of one sequence given how many sequences share the batch right now."""
        p = self.profile
        span = max(1, p.max_batch - 1)
        fill = min(1.0, max(0, self.active - 1) / span)
        rate = p.decode_tps_alone - (p.decode_tps_alone - p.decode_tps_full) * fill
        return rate / self.faults.faults.slow_decode

    async def decode(self, n_tokens: int) -> AsyncIterator[int]:
        """Yield how many new tokens are ready, until ``n_tokens`` (after the first) are out.

        The rate is re-read at every step, so it follows the batch as sequences come and go;
        steps are at least ``tick_ms`` apart so fast profiles don't wake per token.
        """
        if self.profile.zero_latency:
            if n_tokens > 0:
                yield n_tokens
            return
        loop = asyncio.get_running_loop()
        tick = self.profile.tick_ms / 1000
        emitted, credit, last = 0, 0.0, loop.time()
        while emitted < n_tokens:
            rate = self.decode_rate()
            await asyncio.sleep(max((1.0 - credit) / rate, tick))
            now = loop.time()
            credit += (now - last) * rate
            last = now
            k = min(int(credit), n_tokens - emitted)
            if k:
                credit -= k
                emitted += k
                yield k

    def reset(self) -> None:
        self.cache.clear()
        self.cached_tokens_total = 0
        self.prefilled_tokens_total = 0
