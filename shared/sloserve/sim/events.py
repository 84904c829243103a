"""A tiny discrete-event queue (Vidur keeps events in their own package too)."""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import NamedTuple


class EventKind(IntEnum):
    # At equal times a finishing batch is handled before an arrival, so the
    # instance it frees can take the newcomer in the same instant.
    BATCH_END = 0
    ARRIVAL = 1


class Event(NamedTuple):
    time: float
    kind: EventKind
    seq: int  # ties broken by insertion order
    target: int  # request index (ARRIVAL) or instance index (BATCH_END)


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def push(self, time: float, kind: EventKind, target: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, Event(time, kind, self._seq, target))

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
