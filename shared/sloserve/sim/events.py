"""The simulator's events: arrivals in time order merged with a heap of batch ends.

Arrivals are known up front, so they are a sorted list walked by index, not
heap entries (a million arrivals in a heap cost ~20 comparisons each and
~100 MB); only the in-flight batches (one per busy instance) live in the heap,
as plain ``(time, seq, instance)`` tuples. Order, as before: by time; at equal
times a finishing batch is handled before an arrival, so the instance it frees
can take the newcomer in the same instant; equal batch ends in the order they
were scheduled; equal arrivals in request order. A policy's timer (an empty plan's
``wake_at``) is an entry of the same heap whose index is the instance's plus ``WAKE``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def arrival_order(times: Sequence[float]) -> Sequence[int]:
    """Request indices by arrival time, ties in index order (a stable sort)."""
    if all(a <= b for a, b in zip(times, times[1:])):
        return range(len(times))
    return sorted(range(len(times)), key=times.__getitem__)


WAKE = 1 << 30  # a timer's heap index: WAKE + instance index (a batch end's is the index)


class BatchEnds:
    """Heap of ``(end_time, seq, instance_index)``; ``seq`` breaks ties by push order."""

    __slots__ = ("heap", "_seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int]] = []
        self._seq = 0

    def push(self, time: float, instance: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (time, self._seq, instance))

    def push_wake(self, time: float, instance: int) -> None:
        """Wake ``instance``'s policy at ``time`` (it left the GPU idle on purpose)."""
        self.push(time, WAKE + instance)

    def pop(self) -> tuple[float, int, int]:
        return heapq.heappop(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
