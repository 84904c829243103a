"""One instance's iteration step, for every driver (issue 32, item 1).

decide -> launch -> (the batch runs: simulated, or on an executor) -> land. The
simulator, the live scheduler (with and without overlap), the executor's plan
driver and the benches all step an ``Instance`` through this class alone, so the
order in which a policy is asked, a plan is applied and a result lands is written
once (as mini-sglang's ``scheduler.py`` shares ``_schedule_next_batch`` and
``_process_last_data`` between its normal and overlap loops):

* ``decide(now)``: the policy's plan, applied (KV allocated, queues moved), with
  the requests it offloaded and dropped and an empty plan's timer (``wake_at``).
* ``launch(plan, start, end)``: the plan leaves. With ``overlap`` (vLLM's async
  scheduling, SGLang's overlap scheduler) it is applied at once, ending at ``end``,
  so plan k+1 can be decided while k runs; every running decode is assumed to
  continue and requests at ``max_tokens`` finish (known in advance).
* ``land(flight, outcome)``: the batch's result. Without overlap the plan is applied
  now; with it the provisional application is reconciled (real token ids and end,
  early stops: EOS or a stop id end the request here). ``None``: no executor
  reported (the simulator): the plan ended at ``flight.end`` as launched.
* ``rollback(flight)``: a launched plan whose result never came (the executor was
  lost): tokens never made are taken back.
* ``first_placement(req, dispatch_time)``: which submissions admission control may
  refuse (``sloserve.admission``) -- only a request's first placement.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass

from sloserve.admission import Admission, refusal
from sloserve.batch import BatchPlan, BatchShape
from sloserve.instance import Instance, TokenEvent
from sloserve.request import Request, RequestStatus

# What ``decide`` made: (plan to launch or None: nothing to run now, the requests it
# offloaded, the requests it dropped, an empty plan's timer). A plain tuple: the
# simulator makes one per iteration.
Decision = tuple[BatchPlan | None, list[Request], list[Request], float | None]


@dataclass(slots=True)
class Flight:
    """A launched plan: decided at ``start``, ending (or predicted to end) at ``end``.
    Under overlap it is applied already: ``events`` are its token events and ``marks``
    the request of each (live: kept for ``land`` and ``rollback``, as a finished one
    has left the instance)."""

    plan: BatchPlan
    start: float
    end: float
    shape: BatchShape | None = None  # the simulator's, computed once for timing
    events: list[TokenEvent] | None = None
    marks: list[Request] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """An executor's report of a batch: when it ended, the token id each sampling
    request got, and the requests it stopped early (EOS, a stop id)."""

    end: float
    sampled: Mapping[str, int]
    stopped: Collection[str] = ()


class ResultMismatch(Exception):
    """A result lacks a token the plan's provisional application expects."""


def first_placement(req: Request, dispatch_time: float) -> bool:
    """Whether placing ``req`` at ``dispatch_time`` is its first placement: not an
    offload, not a re-run after its instance was lost (dispatched after its arrival),
    and nothing generated yet. Only first placements may be refused (``admission``)."""
    return req.num_offloads == 0 and req.num_generated == 0 and dispatch_time == req.arrival_time


class InstanceDriver:
    """Steps one ``Instance``. ``overlap``: plans are applied at launch (the live
    scheduler's overlap, ``simulate --overlap``). ``simulated``: no executor reports
    (``land(flight, None)``): each plan ends at its launch's ``end``, and only the
    token events the controller acts on are returned (first and last tokens)."""

    __slots__ = ("instance", "overlap", "simulated")

    def __init__(self, instance: Instance, *, overlap: bool = False,
                 simulated: bool = False) -> None:
        self.instance = instance
        self.overlap = overlap
        self.simulated = simulated

    def decide(self, now: float) -> Decision:
        """The policy's plan at ``now``, applied; ``plan`` None when it has no items."""
        inst = self.instance
        if not (inst.waiting or inst.running):  # ``has_work``, inline: once per iteration
            return None, [], [], None
        plan, offloaded, dropped = inst.schedule(now)
        if plan.is_empty:
            return None, offloaded, dropped, plan.wake_at
        return plan, offloaded, dropped, None

    def refusal(self, req: Request, now: float, dispatch_time: float,
                limits: Admission | None, pace: float = 1.0) -> str | None:
        """Why admission control refuses ``req`` (a first placement only), or None;
        ``pace``: the instance's measured slowdown (``admission.Pace``, live only)."""
        if limits is None or not first_placement(req, dispatch_time):
            return None
        return refusal(self.instance, req, now, limits, pace)

    def launch(self, plan: BatchPlan, start: float, end: float,
               shape: BatchShape | None = None) -> Flight:
        """``plan`` leaves at ``start``, ending (predicted) at ``end``; under overlap it
        is applied now, as if every sequence continues and it ends at ``end``."""
        flight = Flight(plan, start, end, shape)
        if self.overlap:
            inst = self.instance
            if self.simulated:  # the end is the ground truth's: nothing to reconcile
                flight.events = inst.complete(plan, end, every_token=False)
            else:
                reqs = inst.requests
                marked = {it.request_id: reqs[it.request_id] for it in plan.items
                          if it.request_id in reqs}
                flight.events = inst.complete(plan, end)  # no stops, no token ids yet
                flight.marks = [marked[ev.request_id] for ev in flight.events]
        return flight

    def land(self, flight: Flight, outcome: Outcome | None,
             live: Container[str] | None = None) -> list[TokenEvent]:
        """The batch's tokens, its result applied. ``live`` (overlap): the requests still
        wanted (a token of one cancelled meanwhile is dropped)."""
        if flight.events is None:  # not applied at launch: applied now
            if outcome is None:
                return self.instance.complete(flight.plan, flight.end,
                                              every_token=not self.simulated)
            return self.instance.complete(flight.plan, outcome.end, outcome.stopped,
                                          outcome.sampled)
        if outcome is None:
            return flight.events
        return self._reconcile(flight, outcome, live)

    def _reconcile(self, flight: Flight, outcome: Outcome,
                   live: Container[str] | None) -> list[TokenEvent]:
        """The real token ids and end replace the provisional ones; a request the
        executor stopped early finishes now (detached, KV blocks freed)."""
        assert flight.events is not None and flight.marks is not None
        end, sampled, stop = outcome.end, outcome.sampled, set(outcome.stopped)
        out: list[TokenEvent] = []
        for ev, req in zip(flight.events, flight.marks, strict=True):
            rid = ev.request_id
            if live is not None and rid not in live:
                continue
            tok = sampled.get(rid)
            if tok is None:
                raise ResultMismatch(f"no token for {rid}")
            req.token_times[-1] = end  # the provisional one (plan k+1 is not applied yet)
            if req.output_token_ids is None:
                req.output_token_ids = []
            req.output_token_ids.append(tok)
            ev.time, ev.token_id = end, tok
            if rid in stop and not ev.finished:  # EOS / stop id: it ends here
                self.instance.cancel(rid, end)
                req.status = RequestStatus.FINISHED
                ev.finished = True
            if ev.finished:
                req.finish_time = end
            out.append(ev)
        return out

    def rollback(self, flight: Flight, live: Container[str] | None = None) -> None:
        """Undo a launch's application: the executor was lost before the result. A
        request it had finished (at ``max_tokens``) is running again, so the loss's
        ``preempt_all`` sends it back to recompute with the rest."""
        if flight.events is None or flight.marks is None:
            return
        inst = self.instance
        for ev, req in reversed(list(zip(flight.events, flight.marks, strict=True))):
            if live is not None and ev.request_id not in live:
                continue
            req.num_generated -= 1
            req.token_times.pop()
            if ev.finished and req.request_id not in inst.requests:
                req.status, req.finish_time = RequestStatus.RUNNING, None
                inst.requests[req.request_id] = req
                inst.running.append(req)
        flight.events = flight.marks = None

    def lacks_tokens(self, plan: BatchPlan) -> bool:
        """A sequence (re)starting at context 0 whose last token id is still in flight:
        its ``added`` message needs every generated id, so that plan waits for the
        result of the one in flight."""
        reqs = self.instance.requests
        for it in plan.items:
            if it.context_len == 0:
                req = reqs[it.request_id]
                if len(req.output_token_ids or ()) < req.num_generated:
                    return True
        return False
