"""Clients and servers agree on keepalive: an idle connection that clients ping is never
answered with ``GOAWAY too_many_pings`` (which broke the first request after ~4 idle
minutes). Intervals are shortened to 1 s (gRPC's floor) so seconds cover several pings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sloserve.client import Client
from sloserve.services import rpc
from sloserve.services.stack import Stack

SHORT_MS = 1000
IDLE_S = 5.0  # ~5 pings: past the 2 strikes a default server allows


async def _idle_stream_survives(server_options: rpc.Options) -> str:
    """A long-lived stream with no data for ``IDLE_S`` while the client pings: how it ends."""
    server = grpc.aio.server(options=server_options)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        opts = rpc.client_options(keepalive=SHORT_MS)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
            await watch.read()  # SERVING, then nothing more: an idle stream
            await asyncio.sleep(IDLE_S)
            try:
                await asyncio.wait_for(watch.read(), 0.5)
            except TimeoutError:
                return "alive"
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {exc.details()}"
            return "message"
    finally:
        await server.stop(0)


def test_server_defaults_answer_frequent_pings_with_goaway_the_reproduction() -> None:
    """The bug itself, so the next test is known to be able to fail."""
    assert asyncio.run(_idle_stream_survives([])) == "UNAVAILABLE: Too many pings"


def test_agreed_server_options_keep_an_idle_pinged_stream_alive() -> None:
    assert asyncio.run(_idle_stream_survives(rpc.server_options(keepalive=SHORT_MS))) == "alive"


def test_idle_stack_serves_the_next_request_promptly_without_goaway(
    start_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(rpc.KEEPALIVE_ENV, str(SHORT_MS))  # every service and our SDK client
    stack = start_stack(policy="sarathi")
    client = Client(stack.gateway)
    warm = list(client.generate("warm", max_tokens=2))
    time.sleep(IDLE_S)
    t0 = time.monotonic()
    chunks = list(client.generate("after idle", max_tokens=4, timeout=10))
    ttft = chunks[0].time - chunks[0].arrival_time
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    print(f"TTFT before idle {(warm[0].time - warm[0].arrival_time) * 1e3:.1f} ms, "
          f"after {IDLE_S:.0f} s idle {ttft * 1e3:.1f} ms")
    assert time.monotonic() - t0 < 2.0 and ttft < 1.0, ttft
    assert stack.exited() == []
    assert stack.cfg.log_dir is not None
    for log in stack.cfg.log_dir.glob("*.log"):
        text = log.read_text()
        assert "too_many_pings" not in text and "GOAWAY" not in text, log.name


def test_keepalive_env_must_be_a_positive_number_of_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rpc.KEEPALIVE_ENV, "soon")
    with pytest.raises(ValueError, match="SLOSERVE_KEEPALIVE_MS"):
        rpc.keepalive_ms()
