"""A scheduler's streams to several frontends and to the router (issue 33, items 1-2).

With ``up --frontends N`` every frontend opens its own ``Connect`` stream (``Hello.frontend``)
and owns the requests it submits on it: their tokens, offloads and drops go to it alone,
straight from here (no third process on the token path). The router's stream
(``Hello.router``) gets what its ``Controller`` needs: each request's first and last token,
and a state report when the Controller could read something new in it (its waiting
prefills or ticket offer changed, or a request arrived since the last one: the Controller
counts one more waiting prefill per dispatch until the next report). A frontend gets the
state with its own messages (its /metrics), never a message of state alone: per-iteration
messages are what a frontend's CPU per token pays for. The one gateway of
``--frontends 1`` is not here: it gets everything, as before.
"""

from __future__ import annotations

import asyncio

from sloserve.services.proto import scheduler_pb2

OutQueue = asyncio.Queue[scheduler_pb2.SchedulerOutput | None]


class Streams:
    def __init__(self) -> None:
        self.frontends: dict[str, OutQueue] = {}  # frontend id -> its stream's queue
        self.routers: list[OutQueue] = []
        self.owner: dict[str, str] = {}  # request id -> the frontend that submitted it
        self.arrived = True  # a request came since the router's last state report
        self._told: tuple[int, bool] | None = None  # (waiting prefills, declines) it has

    @property
    def active(self) -> bool:
        return bool(self.frontends or self.routers)

    def queue_of(self, request_id: str) -> OutQueue | None:
        fid = self.owner.get(request_id)
        return None if fid is None else self.frontends.get(fid)

    def owned_by(self, frontend_id: str) -> list[str]:
        return [r for r, f in self.owner.items() if f == frontend_id]

    def rejoined(self) -> None:
        """A router (re)connected: its first state report is always sent."""
        self._told = None

    def split(
        self, out: scheduler_pb2.SchedulerOutput
    ) -> list[tuple[OutQueue, scheduler_pb2.SchedulerOutput]]:
        """``out`` cut per stream: each frontend's own tokens, offloads and drops (with the
        state report), the router's control tokens (first, last) and state. A request's
        last token, offload or drop ends its ownership here."""
        parts: dict[str, scheduler_pb2.SchedulerOutput] = {}

        def part(rid: str) -> scheduler_pb2.SchedulerOutput | None:
            fid = self.owner.get(rid)
            if fid is None or fid not in self.frontends:
                return None
            if (m := parts.get(fid)) is None:
                m = parts[fid] = scheduler_pb2.SchedulerOutput(time=out.time)
            return m

        control = []
        for t in out.tokens:
            if (m := part(t.request_id)) is not None:
                m.tokens.append(t)
            if t.index == 0 or t.finished:
                control.append(t)
            if t.finished:
                self.owner.pop(t.request_id, None)
        for rid in out.offloaded:
            if (m := part(rid)) is not None:
                m.offloaded.append(rid)
            self.owner.pop(rid, None)
        for d in out.dropped:
            if (m := part(d.request_id)) is not None:
                m.dropped.append(d)
            self.owner.pop(d.request_id, None)
        state = out.state if out.HasField("state") else None
        msgs = []
        for fid, m in parts.items():
            if state is not None:
                m.state.CopyFrom(state)
            msgs.append((self.frontends[fid], m))
        if state is not None:
            key = (state.num_waiting_prefills, state.declines_ticket)
            if key == self._told and not self.arrived:
                state = None  # nothing new for the Controller
            else:
                self._told, self.arrived = key, False
        if control or state is not None:
            for q in self.routers:
                r = scheduler_pb2.SchedulerOutput(time=out.time, tokens=control)
                if state is not None:
                    r.state.CopyFrom(state)
                msgs.append((q, r))
        return msgs
