"""The supervisor's idle cost (issue 35): a SERVING service is health-checked on one kept
channel every ``healthy_interval``; a failed check reconnects afresh, so a restarted
service is seen SERVING again (docs/reliability.md's recovery figures rest on that)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sloserve.services.stack import Stack
from sloserve.services.supervisor import HealthCheck, Policy, Supervisor

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0)


def test_a_serving_service_is_checked_on_one_kept_channel_and_a_failure_reconnects(
        health_server: tuple[str, health.HealthServicer]) -> None:
    address, servicer = health_server
    servicer.set("svc", SERVING)
    check = HealthCheck(address, "svc")
    assert all(check() for _ in range(5))
    assert check.channels_opened == 1  # not one per check
    servicer.set("svc", NOT_SERVING)
    assert not check()
    servicer.set("svc", SERVING)
    assert check() and check()
    assert check.channels_opened == 2  # afresh after the failure, then kept
    check.reset()


def test_the_supervisor_checks_a_serving_stack_every_healthy_interval_and_still_restarts(
        start_stack: Callable[..., Stack]) -> None:
    stack = start_stack()
    lines: list[str] = []
    sup = Supervisor(stack, Policy(interval=0.1, healthy_interval=1.0, unhealthy_s=3.0),
                     say=lines.append).start()
    try:
        time.sleep(3.0)
        for name, check in sup.checks.items():
            assert check.channels_opened == 1, name
            assert 2 <= check.calls <= 5, (name, check.calls)  # not every 0.1 s poll
        stack.kill("perfmodel")  # a dead process is seen at the next 0.1 s poll
        deadline = time.monotonic() + 60
        while not any("perfmodel SERVING again" in ln for ln in lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
        assert any("perfmodel exited" in ln for ln in lines), lines
        assert sup.checks["perfmodel"].channels_opened >= 2
    finally:
        sup.stop()
