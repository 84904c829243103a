"""Scheduler service: one ``sloserve.instance.Instance`` in real time, behind gRPC.

The core ``Instance`` is the one record of requests, progress and tokens; this
shell keeps only each request's wire input (its ``RequestSpec``: prompt ids,
sampling) and moves messages: submissions and cancels in from the gateway,
plans to the executor and results back (``loop``), tokens, offloads, drops and
the instance state out to the gateway, and durable state to Redis (``state``).

Restart: accepted requests are reloaded from Redis and re-queued as waiting
(running ones recompute, vLLM's preemption semantics); nothing runs until the
gateway reconnects. Its ``Hello`` lists its in-flight requests: known ones
resume (tokens the gateway lacks are replayed at once; later copies of them,
held or regenerated, and regenerated tokens it has are dropped here; the gateway
also drops any token by its index), unknown ones are admitted afresh with
the tokens the gateway already has. Restored requests it does not list (a whole-stack
restart: the new gateway knows none) are offered to it, first on the stream
(``SchedulerOutput.restored``, with their tokens; ones complete in Redis and ones the
instance refused too), so their clients can re-attach (issue 34, item 6); other
unlisted ones (the gateway alone restarted: their clients' streams broke) are cancelled,
with one log line.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import IO

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2

from sloserve.admission import Admission, Pace
from sloserve.deployment import Deployment
from sloserve.driver import InstanceDriver
from sloserve.health import HangDeadline
from sloserve.instance import Instance
from sloserve.policies.flags import config_json
from sloserve.services import admission_flags, obs
from sloserve.services.convert import TableDeltas, request_of, state_to_proto
from sloserve.services.perfmodel.coefficients import Published
from sloserve.services.proto import (
    SERVICE_NAMES,
    common_pb2,
    executor_pb2,
    scheduler_grpc,
    scheduler_pb2,
)
from sloserve.services.scheduler.clock import Clock
from sloserve.services.scheduler.coalesce import Coalescer
from sloserve.services.scheduler.state import RequestStore
from sloserve.services.scheduler.streams import OutQueue, Streams

HOLD_S = 0.003  # gateway messages and the Redis flush wait this long after a plan leaves,
# so they do not compete with the plan's hop to the executor for the CPU


class SchedulerService(scheduler_grpc.SchedulerServicer):
    def __init__(
        self, instance: Instance, store: RequestStore, policy: str,
        executor: executor_pb2.ExecutorDescription, clock: Clock,
        decision_log: IO[str] | None = None, admission: Admission | None = None,
        hang: HangDeadline | None = None, overlap: bool = False,
        deployment: Deployment | None = None, stream_interval: int = 1,
    ) -> None:
        self.deployment = deployment  # the resolved Deployment it runs (Status.deployment)
        self.instance, self.store, self.policy_name, self.executor = (
            instance, store, policy, executor)
        self.admission = admission  # None: every submission is queued
        # plan k+1 leaves while the executor runs plan k (loop, sloserve.driver); the event
        # clock (protocol tests) runs the simulator's timeline, which has no overlap
        self.overlap = overlap and not clock.virtual
        self.driver = InstanceDriver(instance, overlap=self.overlap)  # the loop's one step
        self.hang = hang or HangDeadline()
        self.pace = Pace()  # wall time per iteration / predicted: admission's scale
        self.health: health.aio.HealthServicer | None = None  # set once serving
        self.clock, self.decision_log = clock, decision_log
        self.specs: dict[str, common_pb2.RequestSpec] = {}  # wire input of each request
        self.freed: list[str] = []  # released since the last plan (the executor forgets them)
        self.tables = TableDeltas()  # block tables the executor's stream holds (deltas)
        self.outq: asyncio.Queue[scheduler_pb2.SchedulerOutput | None] | None = None
        self.streams = Streams()  # several frontends and the router (issue 33), else empty
        # a gateway's (frontend's) tokens held across iterations (--stream-interval)
        self.coalescer = Coalescer(stream_interval)
        self._told: tuple[int, bool] | None = None  # the one gateway's Controller's state
        self._held: list[scheduler_pb2.SchedulerOutput] = []  # sends held while a plan hops
        self._hold_timer: asyncio.TimerHandle | None = None
        self._held_urgent = False  # an urgent send is among them
        self.output_seq = 0  # messages put on gateway streams (SchedulerStatus.output_seq)
        self.replayed: dict[str, int] = {}  # re-announced request -> tokens replayed (_replay)
        self.wake = asyncio.Event()
        self.waiting_for_wake = False  # the loop is parked until ``wake``
        self.wake_at: float | None = None  # the policy's timer while parked (wall clock)
        self.synced = asyncio.Event()  # a gateway said which requests it still wants
        self.iterations = 0
        self.overhead: deque[float] = deque(maxlen=5000)
        self.schedule_time: deque[float] = deque(maxlen=5000)
        self.unhidden: deque[float] = deque(maxlen=5000)  # executor idle between batches
        self.coefficients = Published([], 0, 0, 0.0, "", "", 0.0)
        # restored from Redis, not yet offered to a gateway (``_hello``): ids still queued
        # here, complete ones (every max_tokens in Redis) and ones admission refused
        self.unclaimed: set[str] = set()
        self.unclaimed_done: list[common_pb2.RequestSpec] = []
        self.unclaimed_refused: list[tuple[common_pb2.RequestSpec, str]] = []
        self.log = obs.setup_logging("scheduler").bind(instance=instance.instance_id)

    # --- requests ---------------------------------------------------------------
    def admit(self, spec: common_pb2.RequestSpec, persist: bool = True,
              fresh: bool = False) -> str | None:
        """A submission: resume it if known, else add it to the instance. A ``fresh``
        one (off the gateway's stream, not a restore or re-announcement) that is a first
        placement (``sloserve.driver.first_placement``: not a re-run or offload) may be
        refused by admission control (``sloserve.admission``): a drop with the reason.
        Returns the reason it was refused, else None."""
        rid = spec.request_id
        now = self.clock.at_event(spec.dispatch_time or spec.arrival_time)
        req = self.instance.requests.get(rid)
        self.unclaimed.discard(rid)  # a gateway knows it
        if req is None and rid in self.specs:
            return None  # finished here; its release (and last tokens) are on their way
        if req is not None:  # the gateway re-announced it: replay what it lacks
            self._replay(rid, len(spec.generated_token_ids), req.output_token_ids or [], now)
            return None
        try:
            kv = self.instance.kv  # prefix caching: identity from the prompt's token ids
            unit = kv.block_size if kv.prefix_caching else None
            req = request_of(spec, hash_unit=unit)
            if fresh and (why := self.driver.refusal(req, now, spec.dispatch_time,
                                                     self.admission, self.pace.ratio)):
                raise ValueError(why)
            self.instance.add_request(req, now)
        except ValueError as exc:
            self.log.debug("request_refused", request_id=rid, reason=str(exc))
            self.send(scheduler_pb2.SchedulerOutput(
                dropped=[scheduler_pb2.Drop(request_id=rid, reason=str(exc))]))
            return str(exc)
        self.log.debug("request_admitted", request_id=rid, prompt_tokens=len(
            spec.prompt_token_ids), generated=len(spec.generated_token_ids),
            max_tokens=spec.max_tokens, priority=spec.priority)
        self.specs[rid] = spec
        self.streams.arrived = True  # the router's next state report goes out
        if persist:
            self.store.accept(spec)
        self.wake.set()
        return None

    def _replay(self, rid: str, have: int, tokens: list[int], now: float) -> None:
        """Send tokens ``have``.. of ``rid`` at once, ahead of any held message; their
        copies still held or in a batch's unflushed report are dropped when they come,
        so the gateway gets each token it lacks once (``replayed``: the watermark)."""
        self.replayed[rid] = max(have, len(tokens))
        q = self.streams.queue_of(rid) if self.streams.frontends else self.outq
        if q is None or have >= len(tokens):
            return
        out = scheduler_pb2.SchedulerOutput(time=now)
        for k in range(have, len(tokens)):
            out.tokens.add(request_id=rid, index=k, token_id=tokens[k], time=now)
        self._put(q, out)

    def _drop_replayed(self, out: scheduler_pb2.SchedulerOutput) -> None:
        """Remove from ``out`` the tokens below their request's replay watermark; the
        first token at or above it clears the watermark (tokens come in order)."""
        keep = []
        for t in out.tokens:
            mark = self.replayed.get(t.request_id)
            if mark is None:
                keep.append(t)
            elif t.index >= mark:
                keep.append(t)
                del self.replayed[t.request_id]
        if len(keep) < len(out.tokens):
            del out.tokens[:]
            out.tokens.extend(keep)

    def cancel(self, request_id: str) -> None:
        self.streams.owner.pop(request_id, None)
        if self.instance.cancel(request_id, self.clock.now()) is not None:
            self.release(request_id, "cancelled")
            self.wake.set()  # an idle loop flushes the removal

    def release(self, request_id: str, how: str) -> None:
        """The request left this instance (``how``: finished, cancelled, offloaded or
        dropped; a debug line with its id)."""
        self.log.debug("request_released", request_id=request_id, how=how)
        del self.specs[request_id]
        self.freed.append(request_id)
        self.store.forget(request_id)

    def live_requests(self) -> list[tuple[common_pb2.RequestSpec, list[int]]]:
        """Every accepted request still here, with all its tokens (a Redis snapshot)."""
        out = []
        for rid, spec in self.specs.items():
            req = self.instance.requests.get(rid)
            tokens = req.output_token_ids if req is not None else None
            out.append((spec, list(tokens if tokens is not None else spec.generated_token_ids)))
        return out

    def restore(self, saved: list[tuple[common_pb2.RequestSpec, list[int]]]) -> None:
        """Re-queue what Redis holds; each is offered to the first gateway (``_hello``)."""
        for spec, tokens in saved:
            del spec.generated_token_ids[:]
            spec.generated_token_ids.extend(tokens)
            if len(tokens) >= spec.max_tokens:  # finished before the crash was recorded
                self.store.forget(spec.request_id)
                self.unclaimed_done.append(spec)
                continue
            why = self.admit(spec, persist=False)
            if why is not None:  # e.g. a smaller KV than before the restart
                self.store.forget(spec.request_id)
                self.unclaimed_refused.append((spec, why))
            else:
                self.unclaimed.add(spec.request_id)
        if not self.specs:
            self.synced.set()
        self.log.info("restored", requests=len(self.specs), complete=len(self.unclaimed_done),
                      refused=len(self.unclaimed_refused))

    # --- executor health ------------------------------------------------------------
    async def _set_health(self, serving: bool) -> None:
        if self.health is not None:
            status = (health_pb2.HealthCheckResponse.SERVING if serving
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            # the service's own status is readiness (the gateway routes by it); the
            # server's ("") stays liveness: a supervisor must not restart a scheduler
            # whose executor is the one that is down
            await self.health.set(SERVICE_NAMES["scheduler"], status)

    async def draining(self) -> None:
        """A clean stop (issue 34): readiness off, so the gateway's health watch moves our
        requests elsewhere at once, whether or not it follows the registry (a static
        ``--scheduler`` does not)."""
        await self._set_health(False)
        self.log.info("draining", requests=len(self.specs))

    async def executor_lost(self, reason: str, predicted_s: float = 0.0,
                            deadline_s: float = 0.0) -> None:
        """NOT_SERVING (the gateway re-runs our requests elsewhere and cancels them
        here); what ran on the executor is gone: every running request recomputes."""
        if deadline_s > 0:
            self.hang.widen()  # a slow executor is not lost again and again
        moved = self.instance.preempt_all()
        self.freed = []  # the executor's next stream starts empty
        await self._set_health(False)
        self.send(self.output(state=True), urgent=True)
        self.log.warning("executor_lost", reason=reason, requests=len(self.specs),
                         preempted=len(moved), predicted_s=predicted_s, deadline_s=deadline_s,
                         at=time.time())

    async def executor_back(self) -> None:
        await self._set_health(True)
        self.wake.set()
        self.log.info("executor_back", requests=len(self.specs), at=time.time())

    def record(self, entry: dict[str, object]) -> None:
        """A decision for ``--decision-log`` (protocol tests compare it with the simulator)."""
        if self.decision_log is not None:
            self.decision_log.write(json.dumps(entry) + "\n")
            self.decision_log.flush()

    # --- gateway stream ------------------------------------------------------------
    async def Connect(
        self, request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "hello: the first message on Connect must be a Hello")
        assert first is not None
        q: asyncio.Queue[scheduler_pb2.SchedulerOutput | None] = asyncio.Queue()
        if first.hello.frontend or first.hello.router:
            async for part in self._connect_shared(first.hello, request_iterator, q):
                yield part
            return
        if self.outq is not None:
            self.outq.put_nowait(None)  # one gateway at a time: the newest wins
        self.outq = q
        self._hello(first.hello)
        self._put(q, self.output(state=True))
        reader = asyncio.create_task(self._read(request_iterator, q))
        try:
            while (msg := await q.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            self.coalescer.forget(q)
            if self.outq is q:
                self.outq = None

    async def _connect_shared(
        self, hello: scheduler_pb2.Hello, it: AsyncIterator[scheduler_pb2.SchedulerInput],
        q: OutQueue,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        """One of several frontends' streams, or the router's (``Streams``, issue 33): a
        frontend's end cancels its requests here (its clients are gone with it), unless it
        detached first (a clean stop: ``detach``)."""
        fid = hello.gateway_id
        if hello.router:
            self.streams.routers.append(q)
            self.streams.rejoined()
        else:
            old = self.streams.frontends.get(fid)
            if old is not None:
                old.put_nowait(None)  # the same frontend reconnected: the newest wins
            self.streams.frontends[fid] = q
            self._hello(hello)
        self._put(q, self.output(state=True))
        reader = asyncio.create_task(self._read(it, q, "" if hello.router else fid))
        try:
            while (msg := await q.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            self.coalescer.forget(q)
            if q in self.streams.routers:
                self.streams.routers.remove(q)
            if self.streams.frontends.get(fid) is q:
                del self.streams.frontends[fid]
                for rid in self.streams.owned_by(fid):
                    self.cancel(rid)
                self.log.info("frontend_gone", frontend=fid)

    def detach(self, frontend: str) -> None:
        """A frontend stops cleanly: its requests run on unowned, offered (with their
        tokens) to the next frontend that connects, which adopts them for their clients
        to re-attach (``_hello``); its stream's end then cancels none."""
        mine = self.streams.owned_by(frontend)
        for rid in mine:
            del self.streams.owner[rid]
        self.unclaimed.update(mine)
        self.log.info("frontend_detached", frontend=frontend, requests=len(mine))

    def claim(self, frontend: str, rid: str, q: OutQueue) -> None:
        """``frontend`` takes over ``rid`` (a client re-attaches there; the frontend that
        adopted it handed it over, through the router): its owner from now on, offered it
        first with every token so far, so its next tokens follow them on the same stream."""
        live = {spec.request_id: (spec, tokens) for spec, tokens in self.live_requests()}
        if rid not in live:
            self.log.info("claim_unknown", request_id=rid, frontend=frontend)
            return
        spec, tokens = live[rid]
        self.streams.owner[rid] = frontend
        msg = common_pb2.RequestSpec()
        msg.CopyFrom(spec)
        del msg.generated_token_ids[:]
        msg.generated_token_ids.extend(tokens)
        out = self.output()
        out.restored.append(msg)
        self._put(q, out)
        self.log.info("request_claimed", request_id=rid, frontend=frontend, tokens=len(tokens))

    def _hello(self, hello: scheduler_pb2.Hello) -> None:
        """Resume what the gateway lists; offer it the restored requests it does not (first
        on its stream, so their tokens never precede them); cancel the rest. One frontend
        of several (issue 33) cancels only its own."""
        listed = {s.request_id for s in hello.inflight}
        if hello.frontend:  # one of several: only its own requests are its to cancel
            for rid in listed:
                self.replayed.pop(rid, None)
            for rid in [r for r in self.streams.owned_by(hello.gateway_id) if r not in listed]:
                self.cancel(rid)
            for spec in hello.inflight:
                self.streams.owner[spec.request_id] = hello.gateway_id
            # restored ones no frontend listed go to the first that connects: it adopts
            # them (and tells the router); one another frontend lists later is claimed
            # back by that frontend's Hello (the owner is the latest to list it)
            q = self.streams.frontends.get(hello.gateway_id)
            if q is not None:
                for rid in self.unclaimed - listed:
                    self.streams.owner[rid] = hello.gateway_id
                self._offer_restored(listed, q)
                self.unclaimed.clear()
        else:
            self.replayed = {}  # watermarks are per connection
            self._offer_restored(listed, self.outq)
            gone = [r for r in self.specs if r not in listed and r not in self.unclaimed]
            for rid in gone:
                self.cancel(rid)
            if gone:  # the gateway alone restarted: these clients' streams broke with it
                self.log.info("unlisted_cancelled", gateway=hello.gateway_id,
                              requests=len(gone))
            self.unclaimed.clear()  # offered: the gateway owns them now
        for spec in hello.inflight:
            self.admit(spec)
        self.synced.set()
        self.log.info("gateway_connected", gateway=hello.gateway_id, inflight=len(listed))

    def _offer_restored(self, listed: set[str], q: OutQueue | None) -> None:
        """``SchedulerOutput.restored`` (and drops for the refused ones) to the connecting
        gateway (or first frontend, on its queue ``q``): every restored request it does not
        list, with all its tokens."""
        if q is None:
            return
        live = {spec.request_id: (spec, tokens) for spec, tokens in self.live_requests()}
        offered = [*self.unclaimed_done]
        for rid in sorted(self.unclaimed - listed, key=lambda r: live[r][0].arrival_time):
            spec, tokens = live[rid]
            msg = common_pb2.RequestSpec()
            msg.CopyFrom(spec)
            del msg.generated_token_ids[:]
            msg.generated_token_ids.extend(tokens)
            offered.append(msg)
        refused = [(s, why) for s, why in self.unclaimed_refused if s.request_id not in listed]
        if not offered and not refused:
            return
        out = self.output()
        out.restored.extend(offered)
        out.restored.extend(s for s, _ in refused)
        out.dropped.extend(scheduler_pb2.Drop(request_id=s.request_id, reason=why)
                           for s, why in refused)
        self._put(q, out)
        self.log.info("restored_offered", requests=len(offered) - len(self.unclaimed_done),
                      complete=len(self.unclaimed_done), refused=len(refused))
        self.unclaimed_done, self.unclaimed_refused = [], []

    async def _read(
        self, it: AsyncIterator[scheduler_pb2.SchedulerInput],
        q: asyncio.Queue[scheduler_pb2.SchedulerOutput | None], frontend: str = "",
    ) -> None:
        """``frontend``: the submitting frontend's id (one of several), which owns them."""
        try:
            async for msg in it:
                kind = msg.WhichOneof("kind")
                if kind == "submit":
                    if frontend:
                        self.streams.owner[msg.submit.request_id] = frontend
                    self.admit(msg.submit, fresh=True)
                elif kind == "cancel":
                    self.cancel(msg.cancel)
                elif kind == "detach" and frontend:
                    self.detach(frontend)
                elif kind == "claim" and frontend:
                    self.claim(frontend, msg.claim, q)
        finally:
            q.put_nowait(None)

    def output(self, state: bool = False) -> scheduler_pb2.SchedulerOutput:
        """A message for the gateway stamped with this instance's clock (and its state)."""
        now = self.clock.now()
        out = scheduler_pb2.SchedulerOutput(time=now)
        if state:
            out.state.CopyFrom(state_to_proto(self.instance, now))
        return out

    def send(self, out: scheduler_pb2.SchedulerOutput, urgent: bool = False) -> None:
        """``out`` to the gateway (each frontend its part, the router its own), through
        the ``Coalescer`` (``--stream-interval``); ``urgent``: nothing held stays held."""
        if self._hold_timer is not None:  # a plan is on its way: keep the order, send later
            self._held.append(out)
            if urgent:
                self._held_urgent = True
        elif self.streams.active:  # several frontends (and the router): each its own part
            if self.replayed and out.tokens:
                self._drop_replayed(out)
            for q, part in self.streams.split(out):
                if q in self.streams.routers:
                    self._put(q, part)
                elif (msg := self.coalescer.offer(q, part, urgent)) is not None:
                    self._put(q, msg)
            if urgent:
                self._flush_coalesced(out.time)
        elif self.outq is not None:  # none: the gateway resyncs with Hello on reconnect
            if self.replayed and out.tokens:
                self._drop_replayed(out)
            if (msg := self.coalescer.offer(self.outq, out, urgent or self._news(out))):
                self._put(self.outq, msg)

    def _news(self, out: scheduler_pb2.SchedulerOutput) -> bool:
        """The one gateway's Controller could read something new in ``out``'s state (its
        waiting prefills or ticket offer changed, or a request arrived: ``Streams.split``'s
        rule for the router): it is not held."""
        if not out.HasField("state") or self.coalescer.interval == 1:
            return False
        key = (out.state.num_waiting_prefills, out.state.declines_ticket)
        if key == self._told and not self.streams.arrived:
            return False
        self._told, self.streams.arrived = key, False
        return True

    def _flush_coalesced(self, at: float) -> None:
        """Every frontend's held tokens, now (idle, executor lost, stopping)."""
        for q, msg in self.coalescer.flush_all(at):
            if q is self.outq or q in self.streams.frontends.values():
                self._put(q, msg)  # type: ignore[arg-type]

    def _put(self, q: asyncio.Queue[scheduler_pb2.SchedulerOutput | None],
             out: scheduler_pb2.SchedulerOutput) -> None:
        """Onto the gateway's stream, numbered (``SchedulerOutput.seq``)."""
        self.output_seq += 1
        out.seq = self.output_seq
        q.put_nowait(out)

    def hold(self) -> None:
        """Hold gateway messages and the Redis flush for ``HOLD_S`` (a plan just left)."""
        if self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_S, self.unhold)

    def unhold(self) -> None:
        """Send the held messages, in order, and let the Redis writer run."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        held, self._held = self._held, []
        urgent, self._held_urgent = self._held_urgent, False
        for k, out in enumerate(held):
            self.send(out, urgent and k == len(held) - 1)
        self.store.kick(time.perf_counter())

    async def Status(
        self, request: scheduler_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SchedulerStatus:
        inst = self.instance
        o50, o99 = _pcts(self.overhead)
        s50, s99 = _pcts(self.schedule_time)
        u50, u99 = _pcts(self.unhidden)
        return scheduler_pb2.SchedulerStatus(
            instance_id=inst.instance_id, role=inst.role, policy=self.policy_name,
            num_waiting=len(inst.waiting), num_running=len(inst.running),
            kv_free_blocks=inst.kv.num_free_blocks, iterations=self.iterations,
            overhead_p50_s=o50, overhead_p99_s=o99, schedule_p50_s=s50, schedule_p99_s=s99,
            executor=self.executor, coefficients=self.coefficients.values,
            coefficients_version=self.coefficients.version,
            coefficients_refit_interval_s=self.coefficients.refit_interval_s,
            policy_config=config_json(inst.policy.config),
            idle=(self.waiting_for_wake and not self.wake.is_set()
                  and self.wake_at is None),  # nothing planned, nothing due (no timer)
            unhidden_p50_s=u50, unhidden_p99_s=u99, overlap=self.overlap,
            unhidden_samples_s=list(self.unhidden) if request.samples else (),
            admission=admission_flags.to_json(self.admission),
            output_seq=self.output_seq,
            outputs_held=len(self._held) + self.coalescer.held_tokens(),
            deployment="" if self.deployment is None else self.deployment.to_json(),
        )


def _pcts(xs: deque[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    p50, p99 = np.percentile(np.fromiter(xs, float), (50, 99))
    return float(p50), float(p99)
