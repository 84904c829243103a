"""One request's tokens between its scheduler's stream and its client (issue 33, item 3).

The scheduler link appends each token as it arrives, stamped with the time the gateway
received it (every token keeps its own time, whatever leaves with it); the client's
side takes, in one go, every token that is ready. It is woken only when it has
something to send: the first token, then every ``interval`` tokens (vLLM's
``stream_interval``), the last token, or the end (a drop or a cancel). So a client that
falls behind gets what piled up in one message (as vLLM's ``RequestOutputCollector``
merges outputs), and an interval above 1 makes one message (and one task wake-up)
carry several tokens instead of one each.
"""

from __future__ import annotations

import asyncio

from sloserve.controller import Drop
from sloserve.services.proto import scheduler_pb2

TokenEvent = scheduler_pb2.TokenEvent
End = Drop | None  # None: cancelled


class Ended(Exception):
    """The stream ended without its last token: ``why`` is the Drop, or None (cancelled)."""

    def __init__(self, why: End) -> None:
        super().__init__(why)
        self.why = why


class TokenStream:
    """Tokens in (``push``), batches out (``take``); ``close`` ends it early."""

    __slots__ = ("interval", "_events", "_times", "_ended", "_end", "_waiter", "_sent", "_last")

    def __init__(self, interval: int = 1) -> None:
        if interval < 1:
            raise ValueError(f"stream_interval: must be at least 1, got {interval}")
        self.interval = interval
        self._events: list[TokenEvent] = []
        self._times: list[float] = []
        self._ended, self._end = False, None  # type: bool, End
        self._waiter: asyncio.Future[None] | None = None
        self._sent = 0  # tokens taken so far
        self._last = 0.0  # the latest token's time: none is stamped before it

    def push(self, ev: TokenEvent, t: float) -> None:
        """Token ``ev`` arrived at ``t`` (a token held at its scheduler is stamped when it
        was due, ``TokenEvent.held_s``: never before the one it follows)."""
        if t < self._last:
            t = self._last
        self._last = t
        self._events.append(ev)
        self._times.append(t)
        if self._waiter is not None and self._due():
            self._wake()

    def close(self, why: End) -> None:
        """End the stream: a drop, or None (cancelled); tokens already in go out first."""
        if not self._ended:
            self._ended, self._end = True, why
            self._wake()

    def _due(self) -> bool:
        ev = self._events
        return bool(ev) and (self._sent == 0 or len(ev) >= self.interval or ev[-1].finished)

    def _wake(self) -> None:
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    def pending(self) -> list[int]:
        """The indices of the tokens in and not yet taken (tests, replays)."""
        return [ev.index for ev in self._events]

    async def take(self) -> tuple[list[TokenEvent], list[float]]:
        """The tokens ready now (waiting until some are due) and their arrival times;
        raises :class:`Ended` once the stream was closed and every token in is out."""
        while not self._due():
            if self._ended:
                if self._events:
                    break
                raise Ended(self._end)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        events, times = self._events, self._times
        self._events, self._times = [], []
        self._sent += len(events)
        return events, times
