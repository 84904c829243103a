"""gRPC plumbing shared by every service: health checking, reflection, lifecycle.

Keepalive: one policy for every client (services and the SDK) and every server,
agreeing as gRPC's keepalive guide asks: clients ping every ``keepalive_ms``
(also with no call in flight, with no limit on pings without data), and servers
accept pings that often (``min_ping_interval_without_data_ms`` is half of it,
``keepalive_permit_without_calls``), so an idle connection is never answered
with ``GOAWAY too_many_pings``. ``SLOSERVE_KEEPALIVE_MS`` changes the interval
(tests shorten it to cover several pings in a few seconds; gRPC pings at most
once a second whatever is asked).

Servers bind without ``SO_REUSEPORT``: a second process on a port in use fails
to start (:class:`PortInUse`) instead of sharing the port with the first.

Tarpit: gRPC C-core's HTTP/2 transport delays the reset of a stream it refuses
itself (a message over ``grpc.max_receive_message_length``, bad headers) by a
random 100-1000 ms (``grpc.http.tarpit``, on by default), so an oversized request
was answered RESOURCE_EXHAUSTED only after that delay although the transport had
refused it at its 5-byte length prefix, before buffering any of it. The gateway,
which faces clients, turns it off (``tarpit=False``): the refusal goes out at once
(docs/reliability.md, ``infra/experiments/poison_timing.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

PARENT_PID_ENV = "SLOSERVE_PARENT_PID"  # set by a launcher: exit when that process is gone
KEEPALIVE_ENV = "SLOSERVE_KEEPALIVE_MS"
KEEPALIVE_MS = 20_000  # clients ping an idle connection this often
KEEPALIVE_TIMEOUT_MS = 10_000  # and drop it when a ping is not answered in this time
INTERNAL_MESSAGE_BYTES = 64 << 20  # between our own services (plans, Hello)
Options = list[tuple[str, int]]


def keepalive_ms() -> int:
    """The keepalive interval: ``$SLOSERVE_KEEPALIVE_MS`` or :data:`KEEPALIVE_MS`."""
    raw = os.environ.get(KEEPALIVE_ENV)
    if not raw:
        return KEEPALIVE_MS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{KEEPALIVE_ENV}: must be a positive number of ms, got {raw!r}")
    return value


def client_options(keepalive: int | None = None,
                   max_message_bytes: int = INTERNAL_MESSAGE_BYTES) -> Options:
    """Every channel's options (services and SDK): see the module's keepalive note."""
    k = keepalive or keepalive_ms()
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", k),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_options(keepalive: int | None = None,
                   max_receive_bytes: int = INTERNAL_MESSAGE_BYTES,
                   tarpit: bool = True, reuse_port: bool = False) -> Options:
    """Every server's options: accepts the clients' pings, refuses a port in use;
    ``tarpit=False``: a message over ``max_receive_bytes`` is refused at once (see the
    module's tarpit note); ``reuse_port``: share the port with other processes that set it
    too (SO_REUSEPORT: ``up --frontends N``, issue 33)."""
    k = keepalive or keepalive_ms()
    return [
        *([] if tarpit else [("grpc.http.tarpit", 0)]),
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", INTERNAL_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", k),  # the server checks its clients too
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", max(1, k // 2)),  # <= client's
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", int(reuse_port)),
    ]


CHANNEL_OPTIONS = client_options()  # as of import; ``client_options()`` rereads the env


class PortInUse(OSError):
    """A server could not bind its port (another process listens on it)."""


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


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`PortInUse` if something listens on ``host:port`` (checked before
    gRPC tries, whose own refusal comes with a core log line besides ours)."""
    host = host.strip("[]")
    for family, kind, proto, _, addr in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no user
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(
                        f"port {port}: cannot listen on {host}:{port}, already in use") from None
                raise


def channel(target: str) -> grpc.aio.Channel:
    """An internal channel: sends ``$SLOSERVE_INTERNAL_TOKEN`` on every call when set, over
    mutual TLS when ``$SLOSERVE_INTERNAL_{CA,CERT,KEY}`` are (``tls.py``, issue 34)."""
    from sloserve.services.auth import internal_token, sending
    from sloserve.services.tls import MutualTLS

    mtls = MutualTLS.from_env()
    ch = (grpc.aio.insecure_channel(target, options=client_options()) if mtls is None else
          grpc.aio.secure_channel(target, mtls.channel_credentials(), options=client_options()))
    return sending(ch, internal_token())


async def start_server(
    host: str, port: int, service_name: str, register: Callable[[grpc.aio.Server], None],
    max_receive_bytes: int = INTERNAL_MESSAGE_BYTES,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    internal: bool = True,
    tarpit: bool = True,
    credentials: grpc.ServerCredentials | None = None,
    reuse_port: bool = False,
    private_port: int = 0,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """Start an aio server with our servicer, standard health checking and reflection.

    ``internal`` servers require ``$SLOSERVE_INTERNAL_TOKEN`` on every call but health
    checks when it is set (``auth``); the gateway passes its own API-key check instead,
    and ``tarpit=False`` (see :func:`server_options`). ``credentials``: serve TLS; an
    ``internal`` server without them serves mutual TLS when ``$SLOSERVE_INTERNAL_*`` say so.

    The service reports SERVING once started; call ``set_not_serving`` on drain.
    Raises :class:`PortInUse` when ``host:port`` is taken. ``reuse_port``: ``port`` is
    shared with the other frontends (SO_REUSEPORT; taken only by a process without it);
    ``private_port``: also listen there alone (``up``'s health checks of this process).
    """
    if port and not reuse_port:
        check_port_free(host, port)
    if private_port:
        check_port_free(host, private_port)
    if internal:
        from sloserve.services.auth import internal_interceptors
        from sloserve.services.tls import MutualTLS

        interceptors = [*internal_interceptors(), *interceptors]
        mtls = MutualTLS.from_env()
        if credentials is None and mtls is not None:
            credentials = mtls.server_credentials()
    server = grpc.aio.server(
        options=server_options(max_receive_bytes=max_receive_bytes, tarpit=tarpit,
                               reuse_port=reuse_port),
        interceptors=interceptors)
    register(server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection(
        (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    for p in (port, private_port) if private_port else (port,):
        try:
            bound = (server.add_insecure_port(f"{host}:{p}") if credentials is None else
                     server.add_secure_port(f"{host}:{p}", credentials))
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise PortInUse(f"port {p}: cannot listen on {host}:{p}, already in use")
    await server.start()
    for name in ("", service_name):
        await hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, hs


async def serve_until_signal(
    server: grpc.aio.Server,
    tasks: Iterable[asyncio.Task[None]] = (),
    grace: float = 2.0,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM or until one of ``tasks`` ends (its error is re-raised),
    then stop accepting and drain for ``grace`` seconds. ``before_stop``: awaited first on
    a signal, with ``tasks`` still running (a scheduler deregisters and drains, issue 34)."""
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
    if before_stop is not None and waiter in done:
        await before_stop()
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


def health_channel(target: str,
                   credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A blocking channel to ``target``: TLS with ``credentials``, else plaintext."""
    if credentials is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, credentials)


def wait_healthy(target: str, service: str = "", timeout: float = 30.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
    """Block until ``target`` reports SERVING for ``service`` (raises TimeoutError)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with health_channel(target, credentials) as ch:
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
    from sloserve.services.argtypes import DefaultsHelpFormatter, number
    from sloserve.services.redisconn import url_arg
    from sloserve.services.registry import DEFAULT_TTL_S
    from sloserve.services.store import DEFAULT_REDIS_URL, redis_url

    p = argparse.ArgumentParser(prog=f"python -m sloserve.services.{name}",
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="the address to bind")
    p.add_argument("--advertise", default=None, metavar="HOST[:PORT]",
                   help="the address others dial, registered in Redis (issue 34); default "
                        "--host:--port (a wildcard --host: this machine's name)")
    if port is None:
        p.add_argument("--port", type=int, required=True)
    else:
        p.add_argument("--port", type=int, default=port)
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"),
                   help="default $SLOSERVE_LOG_LEVEL, else info")
    if redis:
        p.add_argument("--redis-url", default=redis_url() or DEFAULT_REDIS_URL, type=url_arg,
                       help="redis://, rediss:// or redis+sentinel://HOST:PORT[,HOST:PORT"
                       "...]/MASTER_NAME/DB; default $REDIS_URL (a password stays off the "
                       "command line)")
        p.add_argument("--prefix", default="sloserve")
        p.add_argument(
            "--registry-ttl",
            type=number(float, 0),
            default=DEFAULT_TTL_S,
            metavar="SECONDS",
            help="the registry entry expires this long after the last heartbeat",
        )
    return p


def run_service(
    serve: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
) -> int:
    """Run ``serve``; a port in use ends it with one line naming the port (exit 2)."""
    args = parser.parse_args(argv)
    if getattr(args, "log_level", None):
        os.environ["SLOSERVE_LOG_LEVEL"] = args.log_level  # obs.setup_logging reads it
    try:
        asyncio.run(serve(args))
    except PortInUse as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0
