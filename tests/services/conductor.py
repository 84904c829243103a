"""A conductor for the live stack on a virtual clock: the simulator's event loop, distributed.

Services started with ``clock="virtual"`` never read the wall clock: schedulers
run the event clock, sim executors hold each batch's result until the horizon
(``Keys.clock``) reaches its end and report the end they hold
(``Keys.clock_held``), and the gateway takes each request's arrival time from
the call's metadata. The conductor moves the horizon one event at a time, in
the simulator's global order (a batch end before an arrival at the same
time), letting the stack settle after each move; so the live stack sees
exactly the simulator's timeline.

Settled means nothing can still happen before the horizon moves: every
instance either holds a batch whose end is past the horizon or is parked with
nothing to plan, the instances together hold every request that was sent and
has not ended (none is between gateway and scheduler, or being offloaded), and
the gateway has applied every message the schedulers sent (their tokens and
state reports: the next arrival is routed on the view the simulator's
controller has), none held back.
"""

from __future__ import annotations

import asyncio
import math

import grpc
import redis.asyncio as aioredis

from sloserve.request import Request
from sloserve.services.bench_cmd import prompt_ids
from sloserve.services.gateway.server import ARRIVAL_METADATA
from sloserve.services.proto import (
    common_pb2,
    gateway_grpc,
    gateway_pb2,
    scheduler_grpc,
    scheduler_pb2,
)
from sloserve.services.stack import Stack
from sloserve.services.store import Keys

POLL_S = 0.005


def _request(req: Request) -> gateway_pb2.GenerateRequest:
    msg = gateway_pb2.GenerateRequest(
        request_id=req.request_id, prompt_token_ids=prompt_ids(req), max_tokens=req.output_len,
        priority=req.priority, sampling=common_pb2.Sampling(ignore_eos=True))
    for name, value in (("ttft_slo", req.slo.ttft), ("tbt_slo", req.slo.tbt),
                        ("jct_slo", req.slo.jct)):
        if value is not None:
            setattr(msg, name, value)
    return msg


class Conductor:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.keys = Keys(stack.prefix)
        self.horizon = -math.inf
        self.streams: dict[str, list[gateway_pb2.GenerateChunk]] = {}
        self.errors: dict[str, str] = {}
        self.sent = 0
        self.ended = 0
        # instance -> (its scheduler's stub, its executor's name in Keys.clock_held)
        self.instances = {
            name.removeprefix("scheduler-"): svc.address
            for name, svc in stack.services.items() if name.startswith("scheduler-")}
        self.executors = {
            name.removeprefix("executor-"): svc.address
            for name, svc in stack.services.items() if name.startswith("executor-")}

    async def run(self, requests: list[Request], timeout: float = 120.0) -> None:
        redis = aioredis.Redis.from_url(self.stack.redis_url)
        channel = grpc.aio.insecure_channel(self.stack.gateway)
        stub = gateway_grpc.GatewayStub(channel)
        await asyncio.wait_for(channel.channel_ready(), timeout)  # calls go out in order
        schedulers = {i: scheduler_grpc.SchedulerStub(grpc.aio.insecure_channel(a))
                      for i, a in self.instances.items()}
        pending = sorted(requests, key=lambda r: r.arrival_time)
        tasks: list[asyncio.Task[None]] = []
        try:
            await asyncio.wait_for(self._loop(redis, stub, schedulers, pending, tasks), timeout)
        finally:
            for t in tasks:
                t.cancel()
            await channel.close()
            await redis.aclose()

    async def _loop(
        self, redis: aioredis.Redis, stub: gateway_grpc.GatewayStub,
        schedulers: dict[str, scheduler_grpc.SchedulerStub], pending: list[Request],
        tasks: list[asyncio.Task[None]],
    ) -> None:
        while pending or not all(t.done() for t in tasks):
            held = await self._settle(redis, stub, schedulers)
            next_end = min(held, default=math.inf)
            next_arrival = pending[0].arrival_time if pending else math.inf
            if math.isinf(next_end) and math.isinf(next_arrival):
                await asyncio.sleep(POLL_S)  # the last streams are closing
            elif next_end <= next_arrival:  # the simulator's order at equal times
                await self._move(redis, next_end)
            else:
                req = pending.pop(0)
                await self._move(redis, req.arrival_time)
                self.sent += 1
                tasks.append(asyncio.create_task(self._stream(stub, req)))

    async def _move(self, redis: aioredis.Redis, t: float) -> None:
        self.horizon = max(self.horizon, t)
        await redis.set(self.keys.clock, repr(self.horizon))
        await redis.publish(self.keys.clock, repr(self.horizon))

    async def _settle(
        self, redis: aioredis.Redis, gateway: gateway_grpc.GatewayStub,
        schedulers: dict[str, scheduler_grpc.SchedulerStub],
    ) -> list[float]:
        """Wait until the stack is settled (module doc); the batch ends it holds."""
        while True:
            await asyncio.sleep(POLL_S)
            raw = {k.decode(): v.decode() for k, v in
                   (await redis.hgetall(self.keys.clock_held)).items()}
            statuses = await asyncio.gather(
                *(s.Status(scheduler_pb2.StatusRequest(), metadata=self.stack.internal_metadata)
                  for s in schedulers.values()))
            held = {i: raw.get(self.executors[i], "") for i in schedulers}
            settled = all(
                (h != "" and float(h) > self.horizon) or (h == "" and st.idle)
                for h, st in zip(held.values(), statuses))
            on_instances = sum(st.num_waiting + st.num_running for st in statuses)
            read = {i.instance_id: i.output_seq for i in (await gateway.Info(
                gateway_pb2.InfoRequest(), metadata=self.stack.internal_metadata)).instances}
            applied = all(st.outputs_held == 0 and read[i] >= st.output_seq
                          for i, st in zip(schedulers, statuses))
            if settled and applied and on_instances == self.sent - self.ended:
                return [float(h) for h in held.values() if h]

    async def _stream(self, stub: gateway_grpc.GatewayStub, req: Request) -> None:
        chunks = self.streams.setdefault(req.request_id, [])
        call = stub.Generate(_request(req), metadata=((ARRIVAL_METADATA, repr(req.arrival_time)),))
        try:
            async for c in call:
                chunks.append(c)
        except grpc.aio.AioRpcError as exc:
            self.errors[req.request_id] = f"{exc.code().name}: {exc.details()}"
        finally:
            self.ended += 1
