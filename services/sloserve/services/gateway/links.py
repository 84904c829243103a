"""The gateway's stream to one scheduler, reconnected for ever.

Each (re)connection opens with a ``Hello`` listing every in-flight request the
gateway holds on that instance (with the tokens it already has), so nothing
sent while the scheduler was down is lost: messages sent while disconnected
are dropped and the next ``Hello`` carries them instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import structlog

from sloserve.services import rpc
from sloserve.services.proto import common_pb2, scheduler_grpc, scheduler_pb2

MAX_BACKOFF_S = 0.25  # reconnect quickly: a restarted scheduler waits for our Hello
Msg = Any  # scheduler_pb2.SchedulerInput (generated, untyped)


class SchedulerLink:
    def __init__(
        self,
        instance_id: str,
        target: str,
        gateway_id: str,
        inflight: Callable[[str], list[common_pb2.RequestSpec]],
        on_output: Callable[[str, scheduler_pb2.SchedulerOutput], None],
        role: str = "gateway",
    ) -> None:
        """``role``: ``gateway`` (the one), ``frontend`` (one of several: its own requests
        only) or ``router`` (state and first/last tokens: ``scheduler/streams.py``)."""
        self.instance_id, self.target, self.gateway_id = instance_id, target, gateway_id
        self._inflight, self._on_output = inflight, on_output
        self.role = role
        self._q: asyncio.Queue[Msg | None] | None = None
        self.connected = False
        self.closing = False  # the instance left: end the stream once its queue is sent
        self.stub = scheduler_grpc.SchedulerStub(rpc.channel(target))
        self.log = structlog.get_logger().bind(service=role, instance=instance_id)

    def submit(self, spec: common_pb2.RequestSpec) -> None:
        if self._q is not None:
            self._q.put_nowait(scheduler_pb2.SchedulerInput(submit=spec))

    def cancel(self, request_id: str) -> None:
        if self._q is not None:
            self._q.put_nowait(scheduler_pb2.SchedulerInput(cancel=request_id))

    def claim(self, request_id: str) -> None:
        """Take over a request another frontend handed over (``SchedulerInput.claim``):
        the scheduler offers it here with its tokens (``restored``)."""
        if self._q is not None:
            self._q.put_nowait(scheduler_pb2.SchedulerInput(claim=request_id))

    def detach(self) -> None:
        """A frontend of several stopping cleanly: its requests there are left for the next
        frontend (``SchedulerInput.detach``); then the stream ends (``close``)."""
        if self._q is not None:
            self._q.put_nowait(scheduler_pb2.SchedulerInput(detach=True))
        self.close()

    def close(self) -> None:
        """The instance left the deployment: send what is queued, end the stream, and
        reconnect no more."""
        self.closing = True
        if self._q is not None:
            self._q.put_nowait(None)

    async def run(self) -> None:
        backoff = 0.05
        while not self.closing:
            q: asyncio.Queue[Msg | None] = asyncio.Queue()
            hello = scheduler_pb2.Hello(
                gateway_id=self.gateway_id, inflight=self._inflight(self.instance_id),
                frontend=self.role == "frontend", router=self.role == "router")
            q.put_nowait(scheduler_pb2.SchedulerInput(hello=hello))
            self._q = q
            try:
                async for out in self.stub.Connect(_drain(q)):
                    if not self.connected:
                        self.connected, backoff = True, 0.05
                        self.log.info("scheduler_connected", inflight=len(hello.inflight))
                    self._on_output(self.instance_id, out)
            except grpc.aio.AioRpcError as exc:
                self.log.warning("scheduler_stream_broken", code=exc.code().name)
            finally:
                self._q = None
                self.connected = False
                q.put_nowait(None)
            if self.closing:
                return
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)


async def _drain(q: asyncio.Queue[Msg | None]) -> AsyncIterator[Msg]:
    while (msg := await q.get()) is not None:
        yield msg
