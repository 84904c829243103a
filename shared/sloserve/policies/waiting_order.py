"""A waiting queue kept in key order incrementally: what ``sorted(view.waiting, key=f)``
gives, without sorting every iteration (issue 14, incremental decisions).

A heap of ``(key, position, request)``. ``position`` mirrors the request's place in
the instance's waiting deque (arrivals at the back count up, requests put back at
the front count down), so equal keys pop in queue order, exactly as the stable sort
orders them. The policy reports who joined (``join``, ``join_front``); a request is
keyed when it joins and its key must not change while it waits. When the waiting
queue changed behind the policy's back (a cancel, a drop that never surfaced) the
counts disagree and the heap is rebuilt from the queue (O(n), no sort).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterable

from sloserve.request import Request, RequestStatus

Entry = tuple[float, int, Request]


class WaitingOrder:
    """``incremental=False``: every ``sync`` rebuilds from the queue (the reference)."""

    def __init__(self, key: Callable[[Request], float], incremental: bool = True) -> None:
        self.key = key
        self.incremental = incremental
        self._heap: list[Entry] = []
        self._live: dict[str, Entry] = {}
        self._back = itertools.count()
        self._front = itertools.count(-1, -1)
        self._joined: deque[tuple[bool, Request]] = deque()  # (at the front, request)
        self.num_rebuilds = 0

    def join(self, req: Request) -> None:
        """``req`` joined the back of the waiting queue."""
        self._joined.append((False, req))

    def join_front(self, reqs: Iterable[Request]) -> None:
        """``reqs`` (in their queue order) went back to the queue's front."""
        self._joined.extend((True, r) for r in reversed(list(reqs)))

    def sync(self, waiting: Collection[Request]) -> None:
        joined, self._joined = self._joined, deque()
        live = self._live
        fresh: list[tuple[bool, Request]] = []
        for front, r in joined:
            if r.status is RequestStatus.WAITING:
                e = live.get(r.request_id)
                if e is None or e[2] is not r:
                    fresh.append((front, r))
        added = sum(1 for _, r in fresh if r.request_id not in live)
        if self.incremental and len(live) + added == len(waiting):
            for front, r in fresh:
                pos = next(self._front) if front else next(self._back)
                e = live[r.request_id] = (self.key(r), pos, r)
                heapq.heappush(self._heap, e)
            if len(self._heap) > 2 * len(live) + 64:
                self._heap = list(live.values())
                heapq.heapify(self._heap)
            return
        self.num_rebuilds += 1  # rebuild in queue order: positions 0..n-1
        self._back = itertools.count(len(waiting))
        self._front = itertools.count(-1, -1)
        self._live = {r.request_id: (self.key(r), i, r) for i, r in enumerate(waiting)}
        self._heap = list(self._live.values())
        heapq.heapify(self._heap)

    def pop(self) -> Entry | None:
        """The next entry in key order (queue order among equals), off the heap; the
        caller ``discard``s the request if it takes it, else ``push_back``s the entry."""
        while self._heap:
            e = heapq.heappop(self._heap)
            if self._live.get(e[2].request_id) is e:
                return e
        return None

    def push_back(self, entries: Iterable[Entry]) -> None:
        for e in entries:
            if self._live.get(e[2].request_id) is e:
                heapq.heappush(self._heap, e)

    def discard(self, req: Request) -> None:
        """``req`` left the waiting queue (admitted)."""
        self._live.pop(req.request_id, None)
