"""A frontend of several (``up --frontends N``, issue 33, items 1 and 5).

The gateway's request path (``gateway.server.GatewayService``: validate, tokenize,
detokenize, stop strings, auth, per-key limits, the gRPC and OpenAI HTTP APIs) with no
routing state: its ``Placement`` is a ``RouterClient`` that asks the router once per
request. Its own ``Connect`` stream to each scheduler (``Hello.frontend``) carries its
requests' tokens straight to it. Which schedulers there are is the router's news (it
follows the registry in Redis): the frontend opens a stream to each instance the router
lists and closes it when the router says it left; it reads no registry and takes no
``--scheduler`` list of its own. Every frontend listens on the same public gRPC and HTTP
ports (SO_REUSEPORT, as vLLM's ``--api-server-count``): the kernel spreads connections
over them, and a dead one's port stays served by the others. ``--private-port``: this
process alone (``up``'s health checks tell the frontends apart by it).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
import uuid

import grpc
from fastapi import FastAPI

from sloserve.controller import Action, Dispatch
from sloserve.services import obs, rpc
from sloserve.services.convert import request_of
from sloserve.services.frontend.router_client import RouterClient
from sloserve.services.gateway import server as gateway
from sloserve.services.gateway.server import (
    Flight,
    GatewayError,
    GatewayService,
    owner_of,
    scoped_id,
)
from sloserve.services.gateway.stream import TokenStream
from sloserve.services.memtrim import trim_when_grown
from sloserve.services.proto import SERVICE_NAMES, common_pb2, gateway_grpc, router_pb2
from sloserve.services.tls import ServerTLS

BACKLOG = 2048
TAKEOVER_S = 5.0  # a re-attach through another frontend: each step's wait (router, offer)


class FrontendService(GatewayService):
    LINK_ROLE = "frontend"
    ctl: RouterClient

    def on_router(self, actions: list[tuple[Action, int]]) -> None:
        """The router's actions on this frontend's requests, carried out as the one
        gateway carries out its Controller's (a re-run is cancelled where it was)."""
        now = time.time()
        todo = []
        for action, num_offloads in actions:
            f = self.flights.get(action.request_id)
            if f is None:  # ended here before the answer came (the router was told)
                continue
            if isinstance(action, Dispatch):
                if action.cause == "rerun" and f.instance_id and f.instance_id in self.links:
                    self.links[f.instance_id].cancel(action.request_id)
                f.req.num_offloads = num_offloads
            self.ctl.placed(action)
            todo.append(action)
        self._carry_out(todo, now)

    def on_instances(self, out: router_pb2.RouterOutput) -> None:
        """The router's membership news: open a stream to each instance it took in, close
        the one of each that left (its requests here were re-run before: the router sends
        the re-runs first); a snapshot closes every instance it does not list."""
        if out.snapshot:
            listed = {e.instance_id for e in out.instances}
            for iid in [i for i in self.links if i not in listed]:
                self.leave(iid, "not in the router's snapshot")
        for e in out.instances:
            iid = e.instance_id
            if e.left:
                self.leave(iid, e.reason)
                continue
            if iid in self.links and self.addresses.get(iid) != e.address:
                self.leave(iid, "moved")
            if iid not in self.links:
                self.join(iid, e.address, e.status)

    def hand_over(self, rid: str) -> router_pb2.Handover:
        """The router asks for ``rid``, which a client re-attaches to at another frontend:
        let it go if it waits here unattached (adopted after a restart, still running):
        forget it without cancelling it; the other frontend claims it on the scheduler."""
        f = self.flights.get(rid)
        instance = self.ctl.location.get(rid) or (f.instance_id if f else "")
        why = ("not in flight here" if f is None else
               "a client is attached at its frontend" if f.detached_until is None else
               "its instance is gone" if not f.done and instance not in self.links else "")
        if f is None or why:
            return router_pb2.Handover(request_id=rid, reason=why)
        self.flights.pop(rid, None)
        self.ctl.forget(rid)
        self.log.info("request_handed_over", request_id=rid, instance=instance,
                      tokens=len(f.spec.generated_token_ids), ended=f.done)
        # ended with no client attached: its tokens live only here, so they go along
        return router_pb2.Handover(request_id=rid, instance_id=instance,
                                   ended=f.spec if f.done else None)

    async def attach_any(self, owner: str, request_id: str, start_index: int) -> Flight:
        """``attach``; a request another frontend adopted after a restart (the kernel
        picks which frontend a client reaches) is taken over first: the router asks its
        adopter to hand it over, this frontend claims it on the instance's scheduler
        stream and adopts it from the offer, every token so far with it."""
        try:
            return self.attach(owner, request_id, start_index)
        except GatewayError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                raise
            missing = exc
        rid = scoped_id(owner, request_id)
        h = await self.ctl.locate(rid, TAKEOVER_S)
        if not h.instance_id or (h.instance_id not in self.links
                                 and not h.HasField("ended")):
            self.log.info("takeover_refused", request_id=rid, reason=h.reason)
            raise missing
        if h.HasField("ended"):  # nothing runs: served from what the holder kept
            self.adopt_ended(h.instance_id, h.ended)
            return self.attach(owner, request_id, start_index)
        self.links[h.instance_id].claim(rid)
        deadline = time.monotonic() + TAKEOVER_S
        while rid not in self.flights and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the scheduler's offer: adopt() makes the flight
        self.log.info("request_taken_over", request_id=rid, instance=h.instance_id,
                      adopted=rid in self.flights)
        return self.attach(owner, request_id, start_index)

    def adopt_ended(self, instance_id: str, spec: common_pb2.RequestSpec) -> None:
        """A request handed over that ended unattached at its holder: every token it
        produced, replayed to the client that re-attaches (as the holder would have)."""
        owner, client_id = owner_of(spec.request_id, self.auth_on)
        f = Flight(spec, request_of(spec, self.hash_unit), TokenStream(self.stream_interval),
                   instance_id=instance_id, owner=owner, client_id=client_id,
                   detached_until=time.monotonic() + self.reattach_grace,
                   restored=len(spec.generated_token_ids), adopted=True)
        f.complete = f.done = True
        self.flights[spec.request_id] = f
        self.log.info("request_taken_over", request_id=spec.request_id,
                      instance=instance_id, adopted=True, ended=True)

    def start_links(self, iid: str) -> None:
        """Only the scheduler stream: the router watches every instance's health."""
        self.tasks[iid] = [asyncio.create_task(self.links[iid].run())]


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` shared with the other frontends (SO_REUSEPORT);
    a process holding the port without it makes this fail (``rpc.PortInUse``)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise rpc.PortInUse(
            f"port {port}: cannot listen on {host}:{port} "
            f"(shared with the other frontends): {exc.strerror}"
        ) from None
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


async def serve_http(app: FastAPI, sock: socket.socket, tls: ServerTLS | None) -> None:
    """The OpenAI API on a pre-bound shared socket (uvicorn's ``serve(sockets=...)``)."""
    import uvicorn

    from sloserve.services.gateway.openai_http import _Server

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        ssl_certfile=tls.cert if tls else None,
        ssl_keyfile=tls.key if tls else None,
    )
    await _Server(config).serve(sockets=[sock])


async def serve(args: argparse.Namespace) -> None:
    st = await gateway.setup(args, find=False)
    http_sock = (
        reuse_port_socket(args.http_host or args.host, args.http_port) if args.http_port else None
    )
    svc: FrontendService | None = None

    def on_router(actions: list[tuple[Action, int]]) -> None:
        if svc is not None:
            svc.on_router(actions)

    # its id on every stream (schedulers and router: what it owns)
    frontend_id = f"frontend-{args.index}-{uuid.uuid4().hex[:8]}"
    client = RouterClient(args.router, frontend_id, on_router)
    tasks = [asyncio.create_task(client.run())]
    try:  # serve only once the router answers (up starts it first): it lists the instances
        await asyncio.wait_for(client.connected.wait(), args.connect_timeout)
    except TimeoutError:
        raise SystemExit(
            f"frontend: the router at {args.router} did not answer in {args.connect_timeout:g} s"
        ) from None
    if not client.snapshot:
        raise SystemExit(f"frontend: the router at {args.router} lists no instance")
    st.addresses = {i: e.address for i, e in client.snapshot.items()}
    st.statuses = {i: e.status for i, e in client.snapshot.items()}
    svc = FrontendService(client, st.statuses, st.addresses, st.defaults, None, False, st.inputs)
    svc.gateway_id = frontend_id
    for link in svc.links.values():
        link.gateway_id = frontend_id
    client.on_instances = svc.on_instances  # no await since the snapshot: nothing missed
    client.on_handover = svc.hand_over
    svc.hash_unit = (
        next(iter(st.statuses.values())).executor.block_size if st.dep.prefix_routing else None
    )
    gateway.configure(svc, st, args)
    server, _ = await rpc.start_server(
        args.host,
        args.port,
        SERVICE_NAMES["gateway"],
        lambda s: gateway_grpc.add_GatewayServicer_to_server(svc, s),
        max_receive_bytes=st.inputs.max_message_bytes,
        internal=False,
        tarpit=False,
        credentials=st.tls.credentials() if st.tls else None,
        interceptors=gateway.public_interceptors(st.keys),
        reuse_port=True,
        private_port=args.private_port,
    )
    obs.start_metrics(args.metrics_port, args.host)
    for iid in list(svc.links):
        svc.start_links(iid)
    tasks.append(asyncio.create_task(trim_when_grown(log=svc.log)))
    if http_sock is not None:
        from sloserve.services.gateway.openai_http import build_app

        tasks.append(asyncio.create_task(serve_http(build_app(svc, st.keys), http_sock, st.tls)))
    svc.log.info(
        "serving",
        port=args.port,
        http_port=args.http_port,
        frontend=frontend_id,
        router=args.router,
        instances=list(svc.links),
    )
    router_task = tasks[0]

    async def leave() -> None:
        """A clean stop (a whole-stack stop, or ``up`` restarting it) moves and cancels
        no request: each scheduler is told to keep this frontend's requests for the next
        frontend to adopt (``SchedulerLink.detach``; their clients may re-attach there, as
        after the one gateway's stop, issue 34 item 6), then the router stream ends."""
        for link in svc.links.values():
            link.detach()
        links = [t for ts in svc.tasks.values() for t in ts]
        if links:
            await asyncio.wait(links, timeout=1.0)
        router_task.cancel()

    await rpc.serve_until_signal(server, tasks, before_stop=leave)


# the gateway's flags a frontend has no use for (it reads no registry, registers nothing,
# holds no Controller): each is refused by name rather than accepted and ignored
NOT_HERE = {
    "--scheduler": "a frontend takes its instances from the router (give --scheduler to "
                   "the router)",
    "--redis-url": "a frontend reads no Redis: the router follows the registry (give "
                   "--redis-url or $REDIS_URL to the router)",
    "--prefix": "a frontend reads no registry (give --prefix to the router)",
    "--registry-ttl": "a frontend registers nothing in Redis",
    "--advertise": "a frontend registers nothing in Redis (the router dials no frontend)",
    "--min-instances": "the router waits for the instances (give --min-instances to the "
                       "router)",
    "--registry-poll": "a frontend reads no registry (give --registry-poll to the router)",
    "--decision-log": "the router holds the Controller and logs its decisions (give "
                      "--decision-log to the router)",
}


class NotHere(argparse.Action):
    """A gateway flag a frontend refuses: the parser exits naming it (status 2)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        kwargs.pop("nargs", None)
        super().__init__(option_strings, dest, nargs="?", **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string}: {NOT_HERE[str(option_string)]}")


def build_parser() -> argparse.ArgumentParser:
    p = gateway.build_parser()
    p.prog = "python -m sloserve.services.frontend"
    for group in (p, *p._action_groups):  # the flags below replace the gateway's
        group.conflict_handler = "resolve"
    for flag in NOT_HERE:
        p.add_argument(flag, action=NotHere, default=None, help=argparse.SUPPRESS)
    p.add_argument("--clock", choices=("wall",), default="wall",
                   help="wall only: the virtual clock's conductor drives one gateway")
    p.add_argument(
        "--router",
        required=True,
        metavar="HOST:PORT",
        help="the router holding the one Controller (python -m sloserve.services.router)",
    )
    p.add_argument("--index", type=int, default=0, help="this frontend's number (its id, logs)")
    p.add_argument(
        "--private-port",
        type=int,
        default=0,
        help="also listen here alone (health checks of this process; 0: none)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
