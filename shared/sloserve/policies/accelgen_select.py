"""AccelGen's waiting order (§4.3) and multi-resource request selection (§4.4, Algorithm 2).

``RemainingTimeQueue`` keeps waiting requests in ascending remaining time.
Like the paper, a request's ``T_r`` is computed when it enters the queue; we
store it as an absolute *latest start* ``now + T_r`` so the order never needs
re-sorting as time passes. A heap with lazy deletion keeps each iteration at
``O(window · log n)`` however long the queue is.

``nearest_first`` is Algorithm 2 lines 7-13: repeatedly take the request whose
demand ``(D_c, D_m)`` is nearest (Euclidean) to the available ``(A_c, A_m)``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sloserve.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class Entry:
    latest_start: float  # now + T_r at enqueue time; inf for requests with no deadline
    req: Request


class RemainingTimeQueue:
    """Waiting requests by ascending latest start; ties: higher priority, then arrival."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Request]] = []
        self._live: dict[str, int] = {}  # request_id -> seq of its live heap entry (-1: pending)
        self._pending: list[Request] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._live)

    def announce(self, req: Request) -> None:
        """``req`` joined the waiting queue; it is keyed at the next ``key_pending``."""
        self._live[req.request_id] = -1
        self._pending.append(req)

    def push(self, req: Request, latest_start: float) -> None:
        self._seq += 1
        self._live[req.request_id] = self._seq
        heapq.heappush(self._heap, (latest_start, -req.priority, self._seq, req))

    def key_pending(self, key: Callable[[Request], float]) -> None:
        pending, self._pending = self._pending, []
        for req in pending:
            if self._live.get(req.request_id) == -1 and req.status is RequestStatus.WAITING:
                self.push(req, key(req))
            elif self._live.get(req.request_id) == -1:
                del self._live[req.request_id]

    def rebuild(self, waiting: Iterable[Request], key: Callable[[Request], float]) -> None:
        """Resynchronise with the instance's queue (after a cancel the policy was not told of)."""
        self._heap.clear()
        self._live.clear()
        self._pending.clear()
        for req in waiting:
            self.push(req, key(req))

    def peek(self) -> Entry | None:
        """The live entry with the least remaining time, left in place."""
        heap = self._heap
        while heap:
            latest, _, seq, req = heap[0]
            if self._live.get(req.request_id) == seq and req.status is RequestStatus.WAITING:
                return Entry(latest, req)
            heapq.heappop(heap)
            if self._live.get(req.request_id) == seq:
                del self._live[req.request_id]  # cancelled or moved while queued
        return None

    def pop(self) -> Entry | None:
        """Remove and return the live entry with the least remaining time."""
        e = self.peek()
        if e is not None:
            heapq.heappop(self._heap)
            del self._live[e.req.request_id]
        return e

    def restore(self, entries: Iterable[Entry]) -> None:
        """Put back popped entries that were not admitted, keeping their keys."""
        for e in entries:
            self.push(e.req, e.latest_start)


@dataclass(frozen=True, slots=True)
class Demand:
    """Request ``i``'s demand: ``D_c`` compute tokens and ``D_m`` KV space in tokens (§4.4)."""

    compute: int
    kv: int
    exclusive: bool = False  # a long prompt: at most one per batch (ERA, §4.2)


def nearest_first(
    demands: Sequence[Demand | None], a_c: int, a_m: int, max_picks: int
) -> list[int]:
    """Algorithm 2 lines 7-13: indices picked, nearest to ``(A_c, A_m)`` first.

    Both axes are in tokens, as in the paper (``D_m = ⌈S_l/b⌉·b``), so the
    distance is not rescaled. Ties go to the earlier index (smaller ``T_r``).
    """
    picked: list[int] = []
    open_ = [i for i, d in enumerate(demands) if d is not None]
    exclusive_taken = False
    while len(picked) < max_picks:
        best, best_dist = -1, math.inf
        for i in open_:
            d = demands[i]
            assert d is not None
            if d.compute > a_c or d.kv > a_m or (d.exclusive and exclusive_taken):
                continue
            dist = math.hypot(a_c - d.compute, a_m - d.kv)
            if dist < best_dist:
                best, best_dist = i, dist
        if best < 0:
            break
        d = demands[best]
        assert d is not None
        picked.append(best)
        open_.remove(best)
        a_c -= d.compute
        a_m -= d.kv
        exclusive_taken = exclusive_taken or d.exclusive
    return picked
