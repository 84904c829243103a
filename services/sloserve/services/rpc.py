"""gRPC plumbing shared by every service: health checking, reflection, lifecycle."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

PARENT_PID_ENV = "SLOSERVE_PARENT_PID"  # set by a launcher: exit when that process is gone
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10_000),
]


T = TypeVar("T")


async def retry_until_up(call: Callable[[], Awaitable[T]], timeout: float) -> T:
    """``call()`` again every 0.1 s while the peer is unreachable, for up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


async def start_server(
    host: str, port: int, service_name: str, register: Callable[[grpc.aio.Server], None]
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """Start an aio server with our servicer, standard health checking and reflection.

    The service reports SERVING once started; call ``set_not_serving`` on drain.
    """
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    register(server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection(
        (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"port: cannot bind {host}:{port}")
    await server.start()
    for name in ("", service_name):
        await hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, hs


async def serve_until_signal(
    server: grpc.aio.Server, tasks: Iterable[asyncio.Task[None]] = (), grace: float = 2.0
) -> None:
    """Run until SIGINT/SIGTERM or until one of ``tasks`` ends (its error is re-raised),
    then stop accepting and drain for ``grace`` seconds."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waiter: asyncio.Task[Any] = asyncio.create_task(stop.wait())
    watched: set[asyncio.Task[Any]] = set(tasks)
    parent = os.environ.get(PARENT_PID_ENV)
    if parent:
        watched.add(asyncio.create_task(_watch_parent(int(parent))))
    done, _ = await asyncio.wait({waiter, *watched}, return_when=asyncio.FIRST_COMPLETED)
    for t in watched | {waiter}:
        t.cancel()
    await server.stop(grace)
    for t in done & watched:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


async def _watch_parent(pid: int, every: float = 1.0) -> None:
    """Return once our launcher has died (we were re-parented)."""
    while os.getppid() == pid:
        await asyncio.sleep(every)


def wait_healthy(target: str, service: str = "", timeout: float = 30.0) -> None:
    """Block until ``target`` reports SERVING for ``service`` (raises TimeoutError)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{target}: not SERVING after {timeout:.0f}s ({last})")


def service_parser(
    name: str, *, port: int | None = None, redis: bool = True
) -> argparse.ArgumentParser:
    """The flags every service takes: address, metrics port and, if it keeps state, Redis."""
    from sloserve.services.store import DEFAULT_REDIS_URL

    p = argparse.ArgumentParser(prog=f"python -m sloserve.services.{name}")
    p.add_argument("--host", default="127.0.0.1")
    if port is None:
        p.add_argument("--port", type=int, required=True)
    else:
        p.add_argument("--port", type=int, default=port)
    p.add_argument("--metrics-port", type=int, default=0)
    if redis:
        p.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
        p.add_argument("--prefix", default="sloserve")
    return p


def run_service(
    serve: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
) -> int:
    asyncio.run(serve(parser.parse_args(argv)))
    return 0
