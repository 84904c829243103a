"""Scheduler service: drives one ``sloserve.instance.Instance`` in real time.

Each iteration: ``instance.schedule(now)`` (the policy decides) -> the plan
goes down the executor stream -> its ``IterationResult`` comes back ->
``instance.complete(plan, end_time, stopped)`` -> tokens, offloads, drops and
the instance state go up the gateway stream in one message, held with the
Redis flush until ``HOLD_S`` after the next plan has left (off its hop). This
file makes no scheduling decision; it moves messages and persists state
(``state.py``).

Restart: accepted requests are reloaded from Redis and re-queued as waiting
(running ones recompute, vLLM's preemption semantics); nothing runs until the
gateway reconnects. Its ``Hello`` lists its in-flight requests: known ones
resume (tokens the gateway lacks are replayed; tokens it has and we regenerate
carry their index, so it drops them), unknown ones are admitted afresh with
the tokens the gateway already has, and unlisted ones are cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import redis.asyncio as aioredis
from prometheus_client import Gauge, Histogram

from sloserve.batch import BatchPlan
from sloserve.instance import Instance, TokenEvent
from sloserve.kv import BlockManager
from sloserve.policies import Policy, get_spec, policy_names
from sloserve.policies.flags import add_policy_flags, config_from_args, config_json
from sloserve.request import Request
from sloserve.services import obs, rpc
from sloserve.services.convert import request_of
from sloserve.services.perfmodel.coefficients import Published, follow, regression_for
from sloserve.services.proto import (
    SERVICE_NAMES,
    common_pb2,
    executor_grpc,
    executor_pb2,
    scheduler_grpc,
    scheduler_pb2,
)
from sloserve.services.scheduler.state import RequestStore
from sloserve.services.store import Keys

IDLE_POLL_S = 0.002  # re-ask the policy this often while it holds work but plans nothing
HOLD_S = 0.003  # gateway messages and the Redis flush wait this long after a plan leaves,
# so they do not compete with the plan's hop to the executor for the CPU
DROP_REASON = "dropped by the policy under overload (Ascendra §6.3)"

ITERATION = Histogram("sloserve_iteration_seconds", "Executed batch time", ["instance"])
OVERHEAD = Histogram(
    "sloserve_iteration_overhead_seconds", "Per-iteration service overhead", ["instance"],
    buckets=(1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2),
)
QUEUE = Gauge("sloserve_queue_length", "Requests on the instance", ["instance", "state"])


@dataclass(slots=True)
class Record:
    spec: common_pb2.RequestSpec
    req: Request
    tokens: list[int]
    on_executor: bool = False  # the executor has this sequence (NewSequence sent)


class SchedulerService(scheduler_grpc.SchedulerServicer):  # type: ignore[misc]  # generated
    def __init__(
        self, instance: Instance, store: RequestStore, policy: str,
        executor: executor_pb2.ExecutorDescription,
    ) -> None:
        self.instance, self.store, self.policy_name, self.executor = (
            instance, store, policy, executor)
        self.records: dict[str, Record] = {}
        self.outq: asyncio.Queue[scheduler_pb2.SchedulerOutput | None] | None = None
        self.freed: list[str] = []
        self._held: list[scheduler_pb2.SchedulerOutput] = []  # sends held while a plan hops
        self._hold_timer: asyncio.TimerHandle | None = None
        self.wake = asyncio.Event()
        self.synced = asyncio.Event()  # a gateway said which requests it still wants
        self.need_tables = executor.backend != "sim"
        self.iterations = 0
        self.overhead: deque[float] = deque(maxlen=5000)
        self.schedule_time: deque[float] = deque(maxlen=5000)
        self.coefficients = Published([], 0, 0, 0.0, "", "", 0.0)
        self.log = obs.setup_logging("scheduler").bind(instance=instance.instance_id)
        iid = instance.instance_id
        self._m_iter, self._m_over = ITERATION.labels(iid), OVERHEAD.labels(iid)
        self._m_wait, self._m_run = QUEUE.labels(iid, "waiting"), QUEUE.labels(iid, "running")

    # --- requests ---------------------------------------------------------------
    def admit(self, spec: common_pb2.RequestSpec, now: float, persist: bool = True) -> None:
        """A submission: resume it if known, else add it to the instance."""
        rid = spec.request_id
        rec = self.records.get(rid)
        if rec is not None:  # the gateway re-announced it: replay what it lacks
            have = len(spec.generated_token_ids)
            out = scheduler_pb2.SchedulerOutput()
            for k in range(have, len(rec.tokens)):
                out.tokens.add(request_id=rid, index=k, token_id=rec.tokens[k], time=now)
            self._send(out)
            return
        try:
            req = request_of(spec)
            self.instance.add_request(req, now)
        except ValueError as exc:
            self._send(scheduler_pb2.SchedulerOutput(
                dropped=[scheduler_pb2.Drop(request_id=rid, reason=str(exc))]))
            return
        self.records[rid] = Record(spec, req, list(spec.generated_token_ids))
        if persist:
            self.store.accept(spec)
        self.wake.set()

    def cancel(self, request_id: str, now: float) -> None:
        if self.instance.cancel(request_id, now) is not None:
            self._release(request_id)
            self.wake.set()  # an idle loop flushes the removal

    def _release(self, request_id: str) -> None:
        rec = self.records.pop(request_id)
        if rec.on_executor:
            self.freed.append(request_id)
        self.store.forget(request_id)

    def restore(self, saved: list[tuple[common_pb2.RequestSpec, list[int]]]) -> None:
        now = time.time()
        for spec, tokens in saved:
            if len(tokens) >= spec.max_tokens:  # finished before the crash was recorded
                self.store.forget(spec.request_id)
                continue
            del spec.generated_token_ids[:]
            spec.generated_token_ids.extend(tokens)
            self.admit(spec, now, persist=False)
        if not self.records:
            self.synced.set()
        self.log.info("restored", requests=len(self.records))

    # --- gateway stream ------------------------------------------------------------
    async def Connect(
        self, request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        first: Any = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "hello: the first message on Connect must be a Hello")
        q: asyncio.Queue[scheduler_pb2.SchedulerOutput | None] = asyncio.Queue()
        if self.outq is not None:
            self.outq.put_nowait(None)  # one gateway at a time: the newest wins
        self.outq = q
        self._hello(first.hello)
        q.put_nowait(scheduler_pb2.SchedulerOutput(state=self._state(time.time())))
        reader = asyncio.create_task(self._read(request_iterator, q))
        try:
            while (msg := await q.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            if self.outq is q:
                self.outq = None

    def _hello(self, hello: scheduler_pb2.Hello) -> None:
        now = time.time()
        listed = {s.request_id for s in hello.inflight}
        for rid in [r for r in self.records if r not in listed]:
            self.cancel(rid, now)
        for spec in hello.inflight:
            self.admit(spec, now)
        self.synced.set()
        self.log.info("gateway_connected", gateway=hello.gateway_id, inflight=len(listed))

    async def _read(
        self, it: AsyncIterator[scheduler_pb2.SchedulerInput],
        q: asyncio.Queue[scheduler_pb2.SchedulerOutput | None],
    ) -> None:
        try:
            async for msg in it:
                kind = msg.WhichOneof("kind")
                if kind == "submit":
                    self.admit(msg.submit, time.time())
                elif kind == "cancel":
                    self.cancel(msg.cancel, time.time())
        finally:
            q.put_nowait(None)

    def _send(self, out: scheduler_pb2.SchedulerOutput) -> None:
        if self._hold_timer is not None:  # a plan is on its way: keep the order, send later
            self._held.append(out)
        elif self.outq is not None:  # none: the gateway resyncs with Hello on reconnect
            self.outq.put_nowait(out)

    def _hold(self) -> None:
        """Hold gateway messages and the Redis flush for ``HOLD_S`` (a plan just left)."""
        if self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_S, self._unhold)

    def _unhold(self) -> None:
        """Send the held messages, in order, and let the Redis writer run."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        held, self._held = self._held, []
        for out in held:
            self._send(out)
        self.store.kick(time.perf_counter())

    async def Status(
        self, request: scheduler_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SchedulerStatus:
        inst = self.instance
        o50, o99 = _pcts(self.overhead)
        s50, s99 = _pcts(self.schedule_time)
        return scheduler_pb2.SchedulerStatus(
            instance_id=inst.instance_id, role=inst.role, policy=self.policy_name,
            num_waiting=len(inst.waiting), num_running=len(inst.running),
            kv_free_blocks=inst.kv.num_free_blocks, iterations=self.iterations,
            overhead_p50_s=o50, overhead_p99_s=o99, schedule_p50_s=s50, schedule_p99_s=s99,
            executor=self.executor, coefficients=self.coefficients.values,
            coefficients_version=self.coefficients.version,
            policy_config=config_json(inst.policy.config),
        )

    # --- the iteration loop ----------------------------------------------------------
    def _state(self, now: float) -> scheduler_pb2.InstanceState:
        inst = self.instance
        self._m_wait.set(len(inst.waiting))
        self._m_run.set(len(inst.running))
        return scheduler_pb2.InstanceState(
            instance_id=inst.instance_id, num_waiting_prefills=inst.num_waiting_prefills, time=now)

    def _plan_msg(self, plan: BatchPlan) -> executor_pb2.BatchPlan:
        self.iterations += 1
        msg = executor_pb2.BatchPlan(iteration=self.iterations, freed=self.freed)
        self.freed = []
        kv = self.instance.kv
        for it in plan.items:
            rec = self.records[it.request_id]
            req = rec.req
            item = msg.items.add(
                request_id=it.request_id, num_tokens=it.num_tokens, context_len=it.context_len,
                is_prefill=it.is_prefill,
                samples_token=it.context_len + it.num_tokens >= req.num_tokens,
                token_index=req.num_generated,
            )
            if self.need_tables:
                item.block_table.extend(kv.block_table(it.request_id))
            if not rec.on_executor:
                rec.on_executor = True
                msg.added.add(request_id=it.request_id, prompt_token_ids=rec.spec.prompt_token_ids,
                              generated_token_ids=rec.tokens, max_tokens=rec.spec.max_tokens,
                              sampling=rec.spec.sampling)
        msg.preempted.extend(r for r in plan.preempted if self.records[r].on_executor)
        return msg

    def _apply(
        self, plan: BatchPlan, res: executor_pb2.IterationResult, end: float
    ) -> list[tuple[TokenEvent, int]]:
        """Apply an executed plan to the instance; returns its tokens with their ids."""
        sampled = {t.request_id: t.token_id for t in res.tokens}
        events = self.instance.complete(plan, end, res.stopped)
        out = []
        for ev in events:
            tok = sampled[ev.request_id]
            self.records[ev.request_id].tokens.append(tok)
            out.append((ev, tok))
        return out

    def _report(
        self, tokens: list[tuple[TokenEvent, int]], stopped: Sequence[str],
        out: scheduler_pb2.SchedulerOutput,
    ) -> None:
        """Tokens to the gateway and to Redis; finished requests released."""
        stop = set(stopped)
        for ev, tok in tokens:
            out.tokens.add(request_id=ev.request_id, index=ev.index, token_id=tok, time=ev.time,
                           finished=ev.finished, stopped=ev.request_id in stop)
        if tokens:
            self.store.append_tokens({ev.request_id: tok for ev, tok in tokens})
        for ev, _ in tokens:
            if ev.finished:
                self._release(ev.request_id)
        self._send(out)

    async def run(self, executor: executor_grpc.ExecutorStub) -> None:
        # after a restart, run nothing until the gateway's Hello: it says which restored
        # requests are still wanted, and tokens made before then could not be delivered
        await self.synced.wait()
        call = executor.Execute()
        inst = self.instance
        prev_recv: float | None = None  # end of the previous busy iteration
        report: tuple[list[tuple[TokenEvent, int]], Sequence[str],
                      scheduler_pb2.SchedulerOutput] | None = None
        while True:
            if not inst.has_work:
                self._unhold()
                if report is not None:
                    self._report(*report)
                    report = None
                self.store.kick(time.perf_counter(), interval=0.0)
                self._send(scheduler_pb2.SchedulerOutput(state=self._state(time.time())))
                prev_recv = None
                self.wake.clear()
                await self.wake.wait()
                continue
            t0 = time.perf_counter()
            now = time.time()
            plan, offloaded, dropped = inst.schedule(now)
            t1 = time.perf_counter()
            out = scheduler_pb2.SchedulerOutput()
            for req in offloaded:
                self._release(req.request_id)
                out.offloaded.append(req.request_id)
            for req in dropped:
                self._release(req.request_id)
                out.dropped.add(request_id=req.request_id, reason=DROP_REASON)
            if plan.is_empty:
                self._unhold()
                if report is not None:
                    self._report(*report)
                    report = None
                out.state.CopyFrom(self._state(now))
                self._send(out)
                self.store.kick(time.perf_counter())
                prev_recv = None
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), IDLE_POLL_S)
                continue
            await call.write(self._plan_msg(plan))
            self._hold()
            self._send(out)  # offloads and drops decided with this plan
            if report is not None:  # the previous batch's tokens, off the critical path
                self._report(*report)
                report = None
            res = await call.read()
            if res is grpc.aio.EOF:
                raise ConnectionError("executor: the Execute stream ended")
            t_recv = time.perf_counter()
            end = time.time()
            tokens = self._apply(plan, res, end)
            report = (tokens, res.stopped, scheduler_pb2.SchedulerOutput(state=self._state(end)))
            self.schedule_time.append(t1 - t0)
            self._m_iter.observe(res.duration_s)
            if prev_recv is not None:
                over = t_recv - prev_recv - res.duration_s
                self.overhead.append(over)
                self._m_over.observe(over)
            prev_recv = t_recv


def _pcts(xs: deque[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    p50, p99 = np.percentile(np.fromiter(xs, float), (50, 99))
    return float(p50), float(p99)


async def _describe(
    stub: executor_grpc.ExecutorStub, timeout: float
) -> executor_pb2.ExecutorDescription:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await stub.Describe(executor_pb2.DescribeRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def serve(args: argparse.Namespace) -> None:
    policy = policy_from_args(args)  # a bad knob fails before any connection
    redis = aioredis.Redis.from_url(args.redis_url)
    keys = Keys(args.prefix)
    executor = executor_grpc.ExecutorStub(rpc.channel(args.executor))
    desc = await _describe(executor, args.connect_timeout)
    perf_model = regression_for(desc.model, desc.hardware)  # roofline until the first fit
    instance = Instance(
        args.instance_id, policy, BlockManager(desc.kv_capacity_blocks, desc.block_size),
        perf_model, role=args.role,
    )
    store = RequestStore(redis, keys, args.instance_id)
    svc = SchedulerService(instance, store, args.policy, desc)

    def apply(c: Published) -> None:
        perf_model.set_coefficients(c.values)
        svc.coefficients = c

    follower = await follow(redis, keys.coefficients, apply, wait_s=args.coefficients_wait)
    svc.restore(await store.restore())
    server, _ = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["scheduler"],
        lambda s: scheduler_grpc.add_SchedulerServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    gc.collect()
    gc.freeze()  # long-lived startup objects leave the collector's scans (GC pauses hit p99)
    tasks = [asyncio.create_task(svc.run(executor)), asyncio.create_task(store.flush_forever()),
             follower]
    svc.log.info("serving", port=args.port, policy=args.policy, role=args.role,
                 kv_blocks=desc.kv_capacity_blocks, coefficients=svc.coefficients.version)
    try:
        await rpc.serve_until_signal(server, tasks)
    finally:
        await asyncio.wait_for(store.flush(), 2.0)
        await redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("scheduler")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--role", default="lp", choices=("lp", "hp"))
    p.add_argument("--policy", default="sarathi", choices=policy_names())
    p.add_argument("--num-hp", type=int, default=0,
                   help="HP instances in the deployment (an Ascendra LP offloads only if > 0)")
    p.add_argument("--executor", required=True, help="executor address host:port")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--coefficients-wait", type=float, default=20.0,
                   help="seconds to wait at startup for the perf model's first fit")
    add_policy_flags(p)
    return p


def policy_from_args(args: argparse.Namespace) -> Policy:
    """The policy this instance runs: the knob flags' config, the role's rules applied."""
    if args.num_hp < 0:
        raise ValueError(f"--num-hp: must be >= 0, got {args.num_hp}")
    return get_spec(args.policy).make(args.role, config_from_args(args.policy, args),
                                      num_hp=args.num_hp)


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
