"""The scheduler's clock: the wall clock, or a virtual one advanced only by events.

``WallClock`` is production: ``now`` is ``time.time()``. ``EventClock`` is the
simulator's clock kept by the live scheduler: time moves only to a batch's end
(its start plus the duration the executor reports) or to the dispatch stamp of
a request that wakes an idle instance. With the sim backend in the same mode
(a batch ends at ``start_time + duration`` on the wall clock), the live stack
then runs the simulator's timeline exactly, without drift from service hops:
this is what lets a test compare simulated and live decisions one for one.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    virtual: bool

    def now(self) -> float: ...

    def at_event(self, stamp: float) -> float:
        """An event stamped ``stamp`` reached us; returns the time to file it under."""
        ...

    def batch_end(self, start: float, duration: float) -> float:
        """A batch that started at ``start`` came back; returns its end."""
        ...


class WallClock:
    virtual = False

    def now(self) -> float:
        return time.time()

    def at_event(self, stamp: float) -> float:
        return time.time()

    def batch_end(self, start: float, duration: float) -> float:
        return time.time()


class EventClock:
    virtual = True

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def at_event(self, stamp: float) -> float:
        self.t = max(self.t, stamp)
        return self.t

    def batch_end(self, start: float, duration: float) -> float:
        self.t = max(self.t, start + duration)
        return self.t


def make_clock(name: str) -> Clock:
    if name == "wall":
        return WallClock()
    if name == "virtual":
        return EventClock(0.0)
    raise ValueError(f"clock: must be 'wall' or 'virtual', got {name!r}")
