"""A scheduler's messages to a frontend, coalesced across iterations (issue 33, item 3).

A frontend pays a fixed CPU cost per message it receives (gRPC receive, parse, one pass
of its loop), so one message per iteration per instance costs it per iteration, not per
token. With ``--stream-interval N`` (vLLM's ``stream_interval``, which the frontends apply
to their clients) a frontend's tokens are held here and leave together after ``N``
iterations. What may change a decision or end a stream never waits: a first token, a last
token, an offload or a drop leaves at once, with everything held for that frontend (in
order; the count starts again), and so does a state report the Controller could read
something new in (``urgent``). A token in the middle of a stream thus reaches its client at
most ``2N - 1`` iterations after it was made (the frontend sends a stream's tokens every
``N`` of them; vLLM's bound is ``N - 1``). Every token keeps its own time:
``TokenEvent.held_s`` says how long it waited here, and the frontend stamps it as if it had
come at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sloserve.services.proto import scheduler_pb2

TokenEvent = scheduler_pb2.TokenEvent
Out = scheduler_pb2.SchedulerOutput


@dataclass(slots=True)
class _Held:
    """One destination's held tokens (with when each was offered) and latest state."""

    tokens: list[tuple[TokenEvent, float]] = field(default_factory=list)
    state: scheduler_pb2.InstanceState | None = None
    iterations: int = 0  # messages with tokens held since the last full flush


class Coalescer:
    """Per destination (any hashable key: a stream's queue), what to send now."""

    def __init__(self, interval: int = 1) -> None:
        if interval < 1:
            raise ValueError(f"stream_interval: must be at least 1, got {interval}")
        self.interval = interval
        self._held: dict[object, _Held] = {}

    def held_tokens(self) -> int:
        return sum(len(h.tokens) for h in self._held.values())

    def forget(self, dest: object) -> None:
        """``dest``'s stream ended: what it held goes nowhere."""
        self._held.pop(dest, None)

    def offer(self, dest: object, out: Out, urgent: bool = False) -> Out | None:
        """``out`` (one iteration's message for ``dest``): the message to send now, or
        None while it is held. ``urgent``: send everything held now (a state report the
        Controller needs, the loop going idle)."""
        if self.interval == 1:
            return out
        h = self._held.get(dest)
        if h is None:
            h = self._held[dest] = _Held()
        if out.HasField("state"):
            h.state = out.state
        now = time.perf_counter()
        if out.tokens:
            h.iterations += 1
            h.tokens.extend((t, now) for t in out.tokens)
        if (urgent or out.restored or out.offloaded or out.dropped
                or h.iterations >= self.interval
                or any(t.index == 0 or t.finished for t in out.tokens)):
            return self._send(h, out, now)
        return None

    def _send(self, h: _Held, out: Out, now: float) -> Out:
        """Every held token (the count starts again) with ``out``'s offloads, drops,
        restored requests and the latest state."""
        go, h.tokens, h.iterations = h.tokens, [], 0
        msg = Out(time=out.time, offloaded=out.offloaded, dropped=out.dropped,
                  restored=out.restored, tokens=[t for t, _ in go])
        for ev, (_, at) in zip(msg.tokens, go):
            if at != now:
                ev.held_s = now - at
        if h.state is not None:
            msg.state.CopyFrom(h.state)
        return msg

    def flush_all(self, at: float) -> list[tuple[object, Out]]:
        """Every destination's held tokens, stamped ``at`` (the scheduler's clock): the
        loop goes idle or stops."""
        now = time.perf_counter()
        return [(dest, self._send(h, Out(time=at), now))
                for dest, h in self._held.items() if h.tokens]
