"""Memory of the in-process exact cache under unique traffic (what a gateway worker holds)."""

from __future__ import annotations

from gateway.cache.exact import ENTRY_OVERHEAD, MemoryLRU


async def test_expired_entries_are_dropped_without_being_read() -> None:
    lru = MemoryLRU()
    for i in range(200):
        await lru.set(f"k{i}", b"x" * 100, ttl_s=-1)  # already expired
    # Each store drops a few expired entries from the old end: memory stays flat.
    assert len(lru) < 20
    assert lru.bytes < 20 * (110 + ENTRY_OVERHEAD)


async def test_byte_cap_counts_entry_overhead() -> None:
    lru = MemoryLRU(max_bytes=100 * (100 + ENTRY_OVERHEAD))
    for i in range(1000):
        await lru.set(f"k{i:03d}", b"x" * 96, ttl_s=60)
    assert 90 <= len(lru) <= 100
    assert lru.bytes <= lru.max_bytes


async def test_live_entries_stay() -> None:
    lru = MemoryLRU()
    for i in range(50):
        await lru.set(f"k{i}", b"x", ttl_s=60)
    assert len(lru) == 50
    assert await lru.get("k0") == b"x"
