"""Give freed heap back to the OS once a process's RSS has grown (glibc ``malloc_trim``).

gRPC receives every message into buffers of its size and Python copies it once more;
after a burst of multi-MB requests (poison inputs refused by the gateway's checks, or
legitimate 1 MiB prompts) glibc keeps most of that freed memory in its per-thread
arenas, so the gateway's RSS stayed 15-30% above where it was although nothing was
live (docs/reliability.md, poison inputs). ``malloc_trim(0)`` returns it (1-2 ms for
the gateway's heap, measured). :func:`trim_when_grown` checks RSS every ``every``
seconds (one read of ``/proc/self/statm``) and trims, off the event loop, only when
RSS is ``grow_bytes`` above where the last trim left it. Where there is no glibc
(musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Callable
from typing import Any

GROW_BYTES = 4 << 20  # trim once RSS is this far above the last trim's result
EVERY_S = 1.0


def rss_bytes() -> int:
    """This process's resident set size (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _libc_trim() -> Callable[[], object] | None:
    try:  # the process's own symbols: glibc's malloc_trim where the C library is glibc
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


malloc_trim: Callable[[], object] | None = _libc_trim()


async def trim_when_grown(
    every: float = EVERY_S, grow_bytes: int = GROW_BYTES, log: Any = None,
    rss: Callable[[], int] = rss_bytes, trim: Callable[[], object] | None = malloc_trim,
) -> None:
    """Run for ever: every ``every`` s, ``trim()`` in a thread when ``rss()`` has grown by
    ``grow_bytes`` since the last trim (or the start); logs ``memory_trimmed`` at debug."""
    if trim is None:  # no glibc: nothing to do, but a service's task must not end
        await asyncio.Event().wait()
        return
    floor = rss()
    while True:
        await asyncio.sleep(every)
        now = rss()
        if now - floor < grow_bytes:
            floor = min(floor, now)
            continue
        await asyncio.to_thread(trim)
        floor = rss()
        if log is not None:
            log.debug("memory_trimmed", rss_before=now, rss_after=floor)
