"""glibc's heap: hand the memory a processed batch freed back to the system.

An ingest batch decodes 100,000 events at once; when it is done, glibc keeps
most of what they occupied as free chunks inside its arenas (``mallinfo2``'s
``fordblks``: about 200 MiB with 10,000 series), counted in the worker's RSS
although nothing uses it. ``malloc_trim(0)`` returns the whole free pages of
every arena to the kernel (``madvise(MADV_DONTNEED)``); the next batch takes
fresh pages as it needs them.
"""

import ctypes
import time

__all__ = ["release_free_heap"]

#: Seconds between two trims at most (a trim walks every arena: milliseconds).
MIN_INTERVAL_S = 1.0

_last = [0.0]
_libc: list[object] = []


def _trim() -> object | None:
    if not _libc:
        try:
            _libc.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):  # not glibc
            _libc.append(None)
    return _libc[0]


def release_free_heap(now: float | None = None) -> bool:
    """``malloc_trim(0)`` unless one ran within ``MIN_INTERVAL_S``; whether it ran
    (False off glibc)."""
    trim = _trim()
    now = time.monotonic() if now is None else now
    if trim is None or now - _last[0] < MIN_INTERVAL_S:
        return False
    _last[0] = now
    trim(0)  # type: ignore[operator]
    return True
