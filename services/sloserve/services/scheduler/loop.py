"""The scheduler's iteration loop: plan -> executor -> result -> instance -> gateway.

Each iteration the core's ``InstanceDriver`` (``sloserve.driver``) steps the
instance: ``decide`` (the policy's plan, applied), ``launch`` as the plan goes down
the executor stream, ``land`` when its ``IterationResult`` comes back. One loop
serves both schedules: serially, a plan's result lands before the next decision;
with overlap (vLLM's async scheduling, SGLang's overlap scheduler) plan k+1 is
decided and sent while the executor runs plan k, which ``launch`` applied
provisionally and ``land`` reconciles (real token ids and end, early stops);
``rollback`` undoes it when the executor is lost first. Tokens, offloads, drops and the instance
state go up to the gateway, held with the Redis flush until ``HOLD_S`` after
the next plan has left (off its hop) where the executor waits for that plan; with
overlap and a batch in flight the tokens leave at once. An empty plan leaves the instance idle
until the next submission or cancel wakes it, or until the plan's ``wake_at``
(a policy's timer, on the wall clock only: ``--clock virtual`` moves with events,
so its instances offer no timers) — the simulator's rule, so both drivers ask the
policy at the same moments.

Each result must be back by the batch's hang deadline (``sloserve.health``:
factor x the calibrated predicted batch time + slack; none on the event clock,
``--clock virtual``, where results wait for the conductor); a result that is late,
or a broken stream, means the executor is lost: the scheduler turns NOT_SERVING
(the gateway stops routing to it and re-runs its requests elsewhere), puts its
running requests back to recompute, waits for the executor to answer again
(it resumed, or was restarted) and turns SERVING on a fresh stream.

The wall time from one result to the next, against the batch's predicted time, is the
instance's admission pace (``sloserve.admission.Pace``; wall clock only): the shed
decision scales its prediction by it (issue 36, item 3), exported as
``sloserve_admission_pace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Gauge, Histogram

from sloserve.batch import BatchPlan
from sloserve.controller import DROP_BY_POLICY
from sloserve.decisions import plan_record
from sloserve.driver import Flight, Outcome, ResultMismatch
from sloserve.instance import TokenEvent
from sloserve.request import Request
from sloserve.services import metrics
from sloserve.services.convert import plan_to_proto, state_to_proto, tokens_to_proto
from sloserve.services.proto import common_pb2, executor_grpc, executor_pb2, scheduler_pb2
from sloserve.services.scheduler.server import SchedulerService

ITERATION = Histogram("sloserve_iteration_seconds", "Executed batch time", ["instance"])
OVERHEAD = Histogram(
    "sloserve_iteration_overhead_seconds", "Per-iteration service overhead", ["instance"],
    buckets=(1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2),
)
QUEUE = Gauge("sloserve_queue_length", "Requests on the instance", ["instance", "state"])
PACE = Gauge("sloserve_admission_pace",
             "Wall time per iteration / the perf model's prediction (admission's scale)",
             ["instance"])
# (state, events, stopped): the tokens go into the message when it is flushed, after the
# next plan has left, so per-token message building is off the critical path
# (+ each sampled token's logprobs, by request, when its request asked for them: issue 35)
Report = tuple[scheduler_pb2.SchedulerOutput, list[TokenEvent], Sequence[str],
               dict[str, common_pb2.TokenLogprobs]]


def _decide(
    svc: SchedulerService, now: float
) -> tuple[BatchPlan | None, scheduler_pb2.SchedulerOutput]:
    """The policy's plan (None when idle) and the offloads and drops it decided; an empty
    plan's timer is kept in ``svc.wake_at``."""
    svc.wake_at = None
    if not svc.instance.has_work:
        return None, svc.output()
    t0 = time.perf_counter()
    plan, offloaded, dropped, wake_at = svc.driver.decide(now)
    svc.schedule_time.append(took := time.perf_counter() - t0)  # the decision alone
    metrics.DECISION_TIME.labels(svc.executor.model).observe(took)
    out = svc.output()
    _taken(svc, offloaded, dropped, out)
    if plan is None:
        svc.wake_at = wake_at
        return None, out
    svc.record(plan_record(svc.instance.instance_id, plan))
    return plan, out


def _taken(
    svc: SchedulerService, offloaded: list[Request], dropped: list[Request],
    out: scheduler_pb2.SchedulerOutput,
) -> None:
    for req in offloaded:
        svc.release(req.request_id, "offloaded")
        out.offloaded.append(req.request_id)
    for req in dropped:
        svc.release(req.request_id, "dropped")
        out.dropped.add(request_id=req.request_id, reason=req.drop_reason or DROP_BY_POLICY)


def _flush(svc: SchedulerService, report: Report | None) -> None:
    """Send the previous batch's tokens to the gateway and Redis; release finished ones."""
    if report is None:
        return
    out, events, stopped, logprobs = report
    tokens_to_proto(events, stopped, out, svc.instance.requests, logprobs)
    if events:
        svc.store.append_tokens({ev.request_id: ev.token_id for ev in events})
        for rid in [ev.request_id for ev in events if ev.finished]:
            svc.release(rid, "finished")
    svc.send(out)


class ExecutorLost(Exception):
    """The executor died (its stream broke) or hung (no result by the batch's deadline)."""

    def __init__(self, reason: str, predicted_s: float = 0.0, deadline_s: float = 0.0) -> None:
        super().__init__(reason)
        self.predicted_s, self.deadline_s = predicted_s, deadline_s


def _deadline(svc: SchedulerService, predicted_s: float) -> float | None:
    """The batch's hang deadline; none on the event clock, where the executor holds each
    result until the conductor's horizon reaches its end (wall time no model predicts)."""
    return None if svc.clock.virtual else svc.hang.deadline(predicted_s)


async def _read(
    call: Any, deadline_s: float | None, predicted_s: float
) -> executor_pb2.IterationResult:
    """The plan's result, or :class:`ExecutorLost` once ``deadline_s`` has passed."""
    try:
        res = await asyncio.wait_for(call.read(), deadline_s)
    except TimeoutError:
        waited = deadline_s or 0.0  # only a deadline times out
        raise ExecutorLost(f"hung: no result {waited:.3f}s after the plan left "
                           f"(predicted {predicted_s:.3f}s)", predicted_s, waited) from None
    except grpc.aio.AioRpcError as exc:
        raise ExecutorLost(f"dead: the Execute stream broke ({exc.code().name})") from None
    if res is grpc.aio.EOF:
        raise ExecutorLost("dead: the Execute stream ended")
    result: executor_pb2.IterationResult = res
    return result


async def run(svc: SchedulerService, executor: executor_grpc.ExecutorStub) -> None:
    """Iterate for ever; a lost executor (dead or hung) is reported (health NOT_SERVING,
    its requests back to the queue to recompute) and waited for, then work resumes."""
    # after a restart, run nothing until the gateway's Hello: it says which restored
    # requests are still wanted, and tokens made before then could not be delivered
    await svc.synced.wait()
    while True:
        call = executor.Execute()
        svc.tables.reset()  # a new stream: the executor holds no block table
        try:
            await _iterate(svc, call)
        except ExecutorLost as exc:
            call.cancel()
            await svc.executor_lost(str(exc), exc.predicted_s, exc.deadline_s)
            await _until_back(svc, executor)
            await svc.executor_back()


async def _until_back(svc: SchedulerService, executor: executor_grpc.ExecutorStub) -> None:
    """Ask the executor to describe itself until it answers (it restarted or resumed)."""
    delay = 0.05
    while True:
        try:
            await executor.Describe(executor_pb2.DescribeRequest(), timeout=1.0)
            return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)


async def _send(svc: SchedulerService, call: Any, plan: BatchPlan, now: float) -> float:
    """Send ``plan`` to the executor; its predicted duration (computed off the plan's hop).
    A plan that cannot be sent means the executor is lost."""
    inst = svc.instance
    freed, svc.freed = svc.freed, []
    msg = plan_to_proto(inst, plan, svc.specs, svc.iterations, now, freed,
                        svc.tables if svc.executor.backend != "sim" else None)
    try:
        await call.write(msg)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
        raise ExecutorLost(f"dead: the plan could not be sent ({exc!r})") from None
    return inst.perf_model.predict(plan.shape())


class _Families:
    """The scheduler's own families (``services.metrics``), for both loops. Its queues, KV
    usage, preemptions and queue times reach the API port in ``InstanceState`` and the first
    ``TokenEvent`` (issue 35, item 3), not this port."""

    def __init__(self, svc: SchedulerService) -> None:
        self.err = metrics.PERF_ERROR.labels(svc.executor.model)

    def landed(self, predicted_s: float, duration_s: float) -> None:
        if duration_s > 0:
            self.err.observe(abs(predicted_s - duration_s) / duration_s)


async def _park(svc: SchedulerService, out: scheduler_pb2.SchedulerOutput, now: float) -> None:
    """Nothing to plan: report the state and wait for a submission or cancel, or until
    the empty plan's timer (``svc.wake_at``) is due."""
    svc.unhold()
    out.state.CopyFrom(state_to_proto(svc.instance, now))
    svc.send(out, urgent=True)  # nothing held waits for an idle loop
    svc.store.kick(time.perf_counter(), interval=0.0)
    svc.wake.clear()
    svc.waiting_for_wake = True
    timer = None if svc.wake_at is None else max(0.0, svc.wake_at - svc.clock.now())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(svc.wake.wait(), timer)
    svc.waiting_for_wake = False


@dataclass(slots=True)
class _Sent:
    """A launched plan as the loop tracks it: its predicted time (the hang deadline's
    base) and whether the executor was idle before it (its wait is not overhead)."""

    flight: Flight
    predicted_s: float
    after_idle: bool


async def _iterate(svc: SchedulerService, call: Any) -> None:
    """Decide, send, land, report, for ever: one loop for both schedules. Serially
    (``svc.overlap`` off, and always on the event clock) each plan's result lands
    before the next decision; with overlap plan k+1 is decided and sent while the
    executor runs plan k, which ``launch`` applied provisionally meanwhile."""
    inst, clock, driver = svc.instance, svc.clock, svc.driver
    iid = inst.instance_id
    m_iter, m_over = ITERATION.labels(iid), OVERHEAD.labels(iid)
    m_wait, m_run = QUEUE.labels(iid, "waiting"), QUEUE.labels(iid, "running")
    m_pace = PACE.labels(iid)
    fam = _Families(svc)
    flight: _Sent | None = None  # sent (under overlap applied provisionally), not yet read
    after_idle = True  # the executor is idle: the next plan's wait is not overhead
    report: Report | None = None
    prev_recv: float | None = None  # when the previous busy iteration's result came

    async def landed(sent: _Sent) -> Report:
        nonlocal prev_recv
        f, predicted = sent.flight, sent.predicted_s
        res = await _read(call, _deadline(svc, predicted), predicted)
        svc.hang.observe(predicted, res.duration_s)
        t_recv = time.perf_counter()
        end = clock.batch_end(f.start, res.duration_s)
        sampled = {t.request_id: t.token_id for t in res.tokens}
        try:
            events = driver.land(f, Outcome(end, sampled, res.stopped), svc.specs)
        except ResultMismatch as exc:
            raise ExecutorLost(f"dead: result {res.iteration}: {exc}") from None
        out = svc.output()
        out.state.CopyFrom(state_to_proto(inst, end))
        m_iter.observe(res.duration_s)
        m_wait.set(len(inst.waiting))
        m_run.set(len(inst.running))
        fam.landed(predicted, res.duration_s)
        if prev_recv is not None and not sent.after_idle:
            if not clock.virtual:  # the event clock's batches take no wall time
                svc.pace.observe(predicted, t_recv - prev_recv)
                m_pace.set(svc.pace.ratio)
            over = t_recv - prev_recv - res.duration_s
            svc.overhead.append(over)
            m_over.observe(over)
            if res.idle_before_s >= 0:
                svc.unhidden.append(res.idle_before_s)
        prev_recv = t_recv
        logprobs = {t.request_id: t.logprobs for t in res.tokens if t.HasField("logprobs")}
        return out, events, res.stopped, logprobs

    try:
        while True:
            now = clock.now()
            plan, out = _decide(svc, now)
            if plan is None and flight is not None:  # k's result may change that: wait for it
                if out.offloaded or out.dropped:
                    svc.send(out)
                report_k, flight = await landed(flight), None
                _flush(svc, report)
                report = report_k
                continue
            if plan is None:  # idle until a submission, a cancel or the policy's timer
                _flush(svc, report)
                report = None
                await _park(svc, out, now)
                prev_recv, after_idle = None, True
                continue
            svc.iterations += 1
            if flight is not None and driver.lacks_tokens(plan):  # rare: wait for k's ids
                report_k, flight = await landed(flight), None
                _flush(svc, report)
                report = report_k
            predicted = await _send(svc, call, plan, now)
            held = flight is None
            if held:
                # the executor idles until this plan arrives (serial, or overlap after idle):
                # gateway traffic and the Redis flush wait HOLD_S off its hop. With a batch
                # in flight it has work until this plan is due: a hold would only delay
                # every token, the first included, by 3 ms (docs/serve.md, "Prefix caching")
                svc.hold()
            if out.offloaded or out.dropped:
                svc.send(out)  # decided with this plan
            _flush(svc, report)  # the previous batch's tokens, off the critical path
            if not held:  # no hold to end: the Redis writer is kicked here (unhold's part)
                svc.store.kick(time.perf_counter())
            report = None
            if flight is not None:
                report, flight = await landed(flight), None
            flight = _Sent(driver.launch(plan, now, now + predicted), predicted, after_idle)
            after_idle = False
            if not svc.overlap:  # serial: the result lands before the next decision
                report, flight = await landed(flight), None
    finally:
        svc.unhold()
        _flush(svc, report)  # tokens the executor made before it was lost are real
        svc.send(svc.output(), urgent=True)  # and none stays held
        if flight is not None:
            driver.rollback(flight.flight, svc.specs)
