"""Overlap scheduling's bookkeeping: a plan applied before its result, then reconciled.

vLLM's async scheduling / SGLang's overlap scheduler: plan k+1 is decided and
sent while the executor runs plan k. Plan k+1 depends on k's outcome only
through which requests finished and the tokens sampled, so plan k is applied
*provisionally* as soon as it is sent (``fly``: ``Instance.complete`` with no
stops and no token ids, ending at the predicted time): every running decode is
assumed to continue, and requests at ``max_tokens`` finish (that much is known
in advance). The tokens plan k+1 needs are referred to symbolically: a decode
item carries only its position, and the executor appends the token it just
sampled (the sim backend's tokens are a function of (request, index); the
torch and vLLM engines keep their own sequences).

When k's result arrives, ``land`` reconciles: the real token ids and end time
replace the provisional ones, and a request the executor stopped early (EOS,
a stop id) finishes now; its KV blocks are freed here, and the executor skips
it in plan k+1 (``IterationResult.skipped``) until the scheduler's ``freed``
reaches it. ``rollback`` undoes a provisional application whose result never
came (the executor was lost): those tokens were never made.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from sloserve.batch import BatchPlan
from sloserve.instance import Instance, TokenEvent
from sloserve.request import Request, RequestStatus
from sloserve.services.proto import executor_pb2


@dataclass(slots=True)
class Flight:
    """A plan sent and applied provisionally, its result not yet back."""

    plan: BatchPlan
    start: float  # the scheduler clock when it was decided
    predicted_s: float
    after_idle: bool  # the executor was idle before it (its idle time is not overhead)
    marks: list[tuple[TokenEvent, Request]] = field(default_factory=list)


class ResultMismatch(Exception):
    """A result lacks a token the plan's provisional application expects."""


def fly(inst: Instance, plan: BatchPlan, start: float, predicted_s: float,
        after_idle: bool) -> Flight:
    """Apply ``plan`` as if every sequence continues and the batch ends when predicted."""
    reqs = {it.request_id: inst.requests[it.request_id] for it in plan.items
            if it.request_id in inst.requests}
    events = inst.complete(plan, start + predicted_s)  # no stops, no token ids yet
    return Flight(plan, start, predicted_s, after_idle,
                  [(ev, reqs[ev.request_id]) for ev in events])


def land(inst: Instance, flight: Flight, res: executor_pb2.IterationResult, end: float,
         live: Container[str]) -> list[TokenEvent]:
    """Reconcile ``flight`` with its result: real token ids and times, early stops.

    ``live``: the requests still here (one cancelled meanwhile is gone: its token
    is dropped). Returns the token events to report, in plan order."""
    sampled = {t.request_id: t.token_id for t in res.tokens}
    stop = set(res.stopped)
    out: list[TokenEvent] = []
    for ev, req in flight.marks:
        rid = ev.request_id
        if rid not in live:
            continue
        tok = sampled.get(rid)
        if tok is None:
            raise ResultMismatch(f"result {res.iteration}: no token for {rid}")
        req.token_times[-1] = end  # the provisional one (plan k+1 is not applied yet)
        if req.output_token_ids is None:
            req.output_token_ids = []
        req.output_token_ids.append(tok)
        ev.time, ev.token_id = end, tok
        if rid in stop and not ev.finished:  # EOS / stop id: it ends here, not at max_tokens
            inst.cancel(rid, end)  # detached, KV blocks freed
            req.status = RequestStatus.FINISHED
            ev.finished = True
        if ev.finished:
            req.finish_time = end
        out.append(ev)
    return out


def rollback(inst: Instance, flight: Flight, live: Container[str]) -> None:
    """Undo ``fly``: the executor was lost before the result. Tokens never made are
    taken back; a request it had finished (at ``max_tokens``) is running again, so the
    loss's ``preempt_all`` sends it back to recompute with the rest."""
    for ev, req in reversed(flight.marks):
        if ev.request_id not in live:
            continue
        req.num_generated -= 1
        req.token_times.pop()
        if ev.finished and req.request_id not in inst.requests:
            req.status, req.finish_time = RequestStatus.RUNNING, None
            inst.requests[req.request_id] = req
            inst.running.append(req)


def lacks_tokens(inst: Instance, plan: BatchPlan) -> bool:
    """A sequence (re)starting at context 0 whose last token id is still in flight:
    its ``added`` message needs every generated id, so that plan waits for the result."""
    for it in plan.items:
        if it.context_len == 0:
            req = inst.requests[it.request_id]
            if len(req.output_token_ids or ()) < req.num_generated:
                return True
    return False
