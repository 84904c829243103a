"""The gateway's view of one scheduler's health: gRPC ``Health.Watch``, reconnected for ever.

A scheduler is healthy while its health reports SERVING for the scheduler service.
It is lost when it reports anything else (its executor is dead or hung) or when
the watch cannot reach it (the scheduler process is dead). Each change is passed
on once to ``on_change(instance_id, serving)``; the router (the core
``Controller``) does the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sloserve.services import rpc
from sloserve.services.proto import SERVICE_NAMES

MAX_BACKOFF_S = 0.25


class HealthWatch:
    def __init__(self, instance_id: str, target: str,
                 on_change: Callable[[str, bool], None]) -> None:
        self.instance_id, self.on_change = instance_id, on_change
        self.serving = True  # the gateway started only once every scheduler answered
        self.stub = health_pb2_grpc.HealthStub(rpc.channel(target))
        self.log = structlog.get_logger().bind(service="gateway", instance=instance_id)

    def _set(self, serving: bool) -> None:
        if serving != self.serving:
            self.serving = serving
            self.on_change(self.instance_id, serving)

    async def run(self) -> None:
        backoff = 0.05
        req = health_pb2.HealthCheckRequest(service=SERVICE_NAMES["scheduler"])
        while True:
            try:
                async for resp in self.stub.Watch(req):
                    backoff = 0.05
                    self._set(resp.status == health_pb2.HealthCheckResponse.SERVING)
            except grpc.aio.AioRpcError as exc:
                if self.serving:
                    self.log.warning("health_watch_broken", code=exc.code().name)
            self._set(False)  # unreachable: dead until it says otherwise
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
