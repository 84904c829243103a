"""The gateway gives freed heap back to the OS once its RSS has grown (``memtrim``)."""

from __future__ import annotations

import asyncio
import ctypes

import pytest

from sloserve.services import memtrim


def test_malloc_trim_returns_freed_heap_to_the_os() -> None:
    if memtrim.malloc_trim is None:
        pytest.skip("no glibc malloc_trim here")
    # many mid-sized blocks (under glibc's mmap threshold: they live in the heap), freed
    # under a live one, so that glibc's own trimming of the heap's top cannot return them
    blocks = [ctypes.create_string_buffer(64 << 10) for _ in range(1600)]  # 100 MiB
    sentinel = ctypes.create_string_buffer(64 << 10)
    for b in blocks:
        ctypes.memset(b, 1, len(b))
    del blocks, b
    before = memtrim.rss_bytes()
    memtrim.malloc_trim()
    after = memtrim.rss_bytes()
    assert before - after > 50 << 20, (before, after)  # most of the 100 MiB is back
    assert sentinel.raw[:1] == b"\0"


def test_trim_runs_only_once_rss_has_grown_past_the_threshold() -> None:
    readings = iter([100, 101, 103, 110, 104, 105, 120, 106] + [106] * 100)
    trims: list[int] = []

    def trim() -> None:
        trims.append(1)

    async def run() -> None:
        task = asyncio.create_task(memtrim.trim_when_grown(
            every=0.001, grow_bytes=8, rss=lambda: next(readings), trim=trim))
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(run())
    # 100 start; 101, 103 under +8; 110: trim (floor 104 after); 105; 120: trim (floor 106)
    assert len(trims) == 2


def test_without_glibc_the_task_waits_for_ever_instead_of_ending_its_service() -> None:
    async def run() -> bool:
        task = asyncio.create_task(memtrim.trim_when_grown(trim=None))
        await asyncio.sleep(0.05)
        done = task.done()
        task.cancel()
        return done

    assert asyncio.run(run()) is False
