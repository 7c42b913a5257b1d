"""Give the C allocator's free memory back to the system (glibc's `malloc_trim`).

Under eviction churn (a bounded cache replacing its oldest entries), glibc keeps the pages of
freed chunks: RSS grew 35% past what the semantic cache counts (loadtests/semantic_memory.py
--max-mb 64). A trim every few thousand evictions returns most of it, in under a millisecond.
A no-op where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _trimmer() -> Callable[[], None]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int

    def trim() -> None:
        fn(0)

    return trim


trim: Callable[[], None] = _trimmer()
"""Release free heap memory to the system (where the C library can)."""
