"""Router service: the one core ``Controller`` behind N frontends (issue 33, item 2).

A frontend asks it once per request (``RouteAsk`` on its ``Control`` stream) and gets the
Controller's action back on the same stream; it reports what a scheduler took off an
instance (``Scheduled``: offloads, policy drops) and cancels. The router hears each
scheduler's state reports and each request's first and last token on its own stream per
scheduler (``Hello.router``: ``scheduler/streams.py``) and watches each scheduler's
health; a lost instance's re-runs are pushed to the frontends that own them. So Ascendra's
one ticket per HP (§6.1) and round-robin (§4) hold across frontends: one Controller
decides every route, ticket, offload and drop, the same class the simulator drives.
No token crosses this process: tokens go from a scheduler to the owning frontend.

Membership (issue 34, item 2, as the one gateway): the router follows the instance
registry in Redis (``gateway.membership.follow``, the gateway's code path: a join is
``Controller.on_instance_joined``, a leave ``on_instance_left``) beside any fixed
``--scheduler`` list, and tells every frontend on its ``Control`` stream
(``InstanceEvent``): the whole membership first, then each join before any Dispatch to
the instance, and each leave after the re-runs of its requests, so a frontend opens and
closes its own scheduler streams from the router's news alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Iterable
from typing import IO

import grpc

from sloserve.controller import Action, Controller, Dispatch
from sloserve.decisions import action_record
from sloserve.request import Request
from sloserve.services import deployment_flags, obs, rpc
from sloserve.services.argtypes import number
from sloserve.services.gateway import membership
from sloserve.services.gateway.health_watch import HealthWatch
from sloserve.services.gateway.links import SchedulerLink
from sloserve.services.gateway.server import find_instances, prefix_router
from sloserve.services.proto import SERVICE_NAMES, router_grpc, router_pb2, scheduler_pb2
from sloserve.services.registry import DEFAULT_POLL_S, Watch

OutQueue = asyncio.Queue[router_pb2.RouterOutput | None]
ADOPTED_KEPT = 10_000  # as the gateway's ENDED_KEPT


class RouterService(router_grpc.RouterServicer):
    def __init__(
        self, controller: Controller, addresses: dict[str, str],
        decision_log: IO[str] | None = None,
        statuses: dict[str, scheduler_pb2.SchedulerStatus] | None = None,
    ) -> None:
        self.log = obs.setup_logging("router")
        self.ctl, self.decision_log = controller, decision_log
        self.frontends: dict[str, OutQueue] = {}  # frontend id -> its stream's queue
        self.owner: dict[str, str] = {}  # request id -> the frontend that asked
        self.handovers: dict[str, str] = {}  # request id -> the frontend re-attaching it
        # restored requests a frontend adopted, kept after they end (one that ended with
        # no client attached is served from its adopter's memory): request id -> frontend
        self.adopted: OrderedDict[str, str] = OrderedDict()
        self.requests: dict[str, Request] = {}  # what the Controller sees, while placed
        self.router_id = f"router-{uuid.uuid4().hex[:8]}"
        self.addresses = dict(addresses)
        self.statuses = dict(statuses or {})
        self.links: dict[str, SchedulerLink] = {}
        self.watches: dict[str, HealthWatch] = {}
        self.tasks: dict[str, list[asyncio.Task[None]]] = {}  # each instance's link + watch
        for iid, addr in addresses.items():
            self._connect(iid, addr)

    def _connect(self, iid: str, address: str) -> None:
        self.links[iid] = SchedulerLink(
            iid, address, self.router_id, lambda _: [], self.on_output, "router")
        self.watches[iid] = HealthWatch(iid, address, self.on_health)

    def start_links(self, iid: str) -> None:
        """Open ``iid``'s scheduler stream and health watch (in the running loop)."""
        self.tasks[iid] = [asyncio.create_task(self.links[iid].run()),
                           asyncio.create_task(self.watches[iid].run())]

    # --- membership (the registry, as the one gateway: gateway.membership) -------------
    def is_member(self, instance_id: str) -> bool:
        return instance_id in self.links

    def _event(self, iid: str) -> router_pb2.InstanceEvent:
        ev = router_pb2.InstanceEvent(instance_id=iid, address=self.addresses.get(iid, ""))
        if (st := self.statuses.get(iid)) is not None:
            ev.status.CopyFrom(st)
        return ev

    def snapshot(self) -> router_pb2.RouterOutput:
        """The whole membership: the first message on every frontend's stream."""
        return router_pb2.RouterOutput(
            snapshot=True, instances=[self._event(i) for i in self.links])

    def _tell_all(self, msg: router_pb2.RouterOutput) -> None:
        for q in self.frontends.values():
            q.put_nowait(msg)

    def join(self, iid: str, address: str, st: scheduler_pb2.SchedulerStatus) -> None:
        """A scheduler registered and answered its Status: the Controller takes it in, then
        every frontend hears of it (before any Dispatch to it: the same stream)."""
        models = {s.executor.model for s in self.statuses.values()}
        if models and st.executor.model not in models:
            self.log.error("instance_refused", instance=iid, address=address,
                           reason=f"serves {st.executor.model!r}, this deployment "
                                  f"{sorted(models)[0]!r}")
            return
        self.statuses[iid], self.addresses[iid] = st, address
        self._connect(iid, address)
        self.start_links(iid)
        self.ctl.on_instance_joined(iid, st.role, time.time())
        self._tell_all(router_pb2.RouterOutput(instances=[self._event(iid)]))
        self.log.info("instance_joined", instance=iid, address=address, role=st.role,
                      instances=len(self.links))

    def leave(self, iid: str, reason: str) -> None:
        """A scheduler left: the Controller's instance-left transition re-runs its
        requests elsewhere (pushed to their frontends, cancelled there), then every
        frontend hears it left (after the re-runs: the same stream) and closes its stream."""
        if iid not in self.links:
            return
        now = time.time()
        actions = self.ctl.on_instance_left(iid, now)
        link = self.links.pop(iid)
        for a in actions:
            if isinstance(a, Dispatch):
                link.cancel(a.request_id)
        link.close()
        self.watches.pop(iid)
        for t in self.tasks.pop(iid, [])[1:]:  # the health watch; the link ends by itself
            t.cancel()
        self.statuses.pop(iid, None)
        self.addresses.pop(iid, None)
        self._push(actions, now)
        self._tell_all(router_pb2.RouterOutput(
            instances=[router_pb2.InstanceEvent(instance_id=iid, left=True, reason=reason)]))
        self.log.info("instance_left", instance=iid, reason=reason, at=now,
                      rerun=sum(isinstance(a, Dispatch) for a in actions),
                      dropped=sum(not isinstance(a, Dispatch) for a in actions),
                      instances=len(self.links))

    async def follow(self, watch: Watch, timeout: float) -> None:
        await membership.follow(self, watch, timeout)

    # --- frontends ----------------------------------------------------------------
    async def Control(
        self,
        request_iterator: AsyncIterator[router_pb2.RouterInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[router_pb2.RouterOutput]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "hello" or not first.hello.frontend_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "hello: the first message on Control must be a RouterHello with a frontend_id",
            )
        assert first is not None
        fid = first.hello.frontend_id
        q: OutQueue = asyncio.Queue()
        if (old := self.frontends.get(fid)) is not None:
            old.put_nowait(None)  # the same frontend reconnected: the newest stream wins
        self.frontends[fid] = q
        self._hello(fid, first.hello)
        q.put_nowait(self.snapshot())  # connected: the frontend may serve these instances
        reader = asyncio.create_task(self._read(fid, request_iterator, q))
        try:
            while (msg := await q.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            if self.frontends.get(fid) is q:
                del self.frontends[fid]
                self._frontend_gone(fid)

    def _hello(self, fid: str, hello: router_pb2.RouterHello) -> None:
        """A (re)connected frontend's placements: a restarted router learns them."""
        for p in hello.inflight:
            self.placed(fid, p)
        self.log.info("frontend_connected", frontend=fid, inflight=len(hello.inflight))

    def placed(self, fid: str, p: router_pb2.Placement) -> None:
        """A request on an instance that this router did not place there: a frontend's
        after a router restart, or a restored one a frontend adopted."""
        if p.instance_id not in self.links:
            self.log.info("placed_unknown_instance", request_id=p.request_id, frontend=fid,
                          instance=p.instance_id)
            return
        if self.ctl.location.get(p.request_id) != p.instance_id:
            self.ctl.on_placed(p.request_id, p.instance_id, p.started)
        self.owner[p.request_id] = fid
        self.requests.setdefault(p.request_id, Request(p.request_id, 0.0, 1, 1))
        self._adopted(p.request_id, fid)
        self.log.info("request_placed", request_id=p.request_id, frontend=fid,
                      instance=p.instance_id, started=p.started)

    async def _read(self, fid: str, it: AsyncIterator[router_pb2.RouterInput], q: OutQueue) -> None:
        try:
            async for msg in it:
                kind = msg.WhichOneof("kind")
                if kind == "route":
                    self.route(fid, msg.route)
                elif kind == "scheduled":
                    self.scheduled(msg.scheduled)
                elif kind == "placed":
                    self.placed(fid, msg.placed)
                elif kind == "locate":
                    self.locate(fid, msg.locate)
                elif kind == "handed":
                    self.handed(fid, msg.handed)
                elif kind == "cancel":
                    if self.owner.get(msg.cancel) == fid:
                        self.ctl.on_cancel(msg.cancel, time.time())
                        self._forget(msg.cancel)
        finally:
            q.put_nowait(None)

    def locate(self, fid: str, rid: str) -> None:
        """A client re-attaches to ``rid`` at ``fid``, which does not hold it: the frontend
        that adopted it is asked to hand it over (``handed`` answers ``fid``)."""
        holder = self.owner.get(rid) or self.adopted.get(rid)
        q = self.frontends.get(holder) if holder is not None else None
        if q is None or holder == fid:
            self._located(fid, router_pb2.Handover(request_id=rid, reason="in flight on no "
                                                   "other frontend"))
            return
        self.handovers[rid] = fid
        q.put_nowait(router_pb2.RouterOutput(handover=[rid]))

    def handed(self, fid: str, h: router_pb2.Handover) -> None:
        """The holder's answer: handed over (the asker owns it now and claims it on its
        scheduler stream), or not (a client is attached there, it ended)."""
        asker = self.handovers.pop(h.request_id, None)
        if asker is None or (self.owner.get(h.request_id)
                             or self.adopted.get(h.request_id)) != fid:
            return
        if h.instance_id:
            if h.request_id in self.owner:  # still running: the asker claims it next
                self.owner[h.request_id] = asker
            self._adopted(h.request_id, asker)
        self._located(asker, h)
        self.log.info("handover", request_id=h.request_id, src=fid, to=asker,
                      instance=h.instance_id, reason=h.reason)

    def _adopted(self, rid: str, fid: str) -> None:
        self.adopted[rid] = fid
        self.adopted.move_to_end(rid)
        while len(self.adopted) > ADOPTED_KEPT:
            self.adopted.popitem(last=False)

    def _located(self, fid: str, h: router_pb2.Handover) -> None:
        if (q := self.frontends.get(fid)) is not None:
            q.put_nowait(router_pb2.RouterOutput(located=[h]))

    def _frontend_gone(self, fid: str) -> None:
        """Its clients are gone with it (its schedulers cancel its requests too)."""
        for rid in [r for r, f in self.adopted.items() if f == fid]:
            del self.adopted[rid]  # its memory of ended ones is gone with it
        gone = [r for r, f in self.owner.items() if f == fid]
        for rid in gone:
            self.ctl.on_cancel(rid, time.time())
            self._forget(rid)
        self.log.info("frontend_gone", frontend=fid, requests=len(gone))

    def route(self, fid: str, ask: router_pb2.RouteAsk) -> None:
        """A new request: the Controller's admit (a ticketed HP, round-robin, prefix)."""
        now = time.time()
        req = Request(
            ask.request_id,
            ask.arrival_time,
            max(1, ask.prompt_len),
            max(1, ask.max_tokens),
            priority=ask.priority,
        )
        if ask.hash_unit:
            req.hash_ids, req.hash_unit = tuple(ask.hash_ids), ask.hash_unit
        self.owner[ask.request_id] = fid
        self.requests[ask.request_id] = req
        self._push([self.ctl.admit(req, now)], now)

    def scheduled(self, sc: router_pb2.Scheduled) -> None:
        """What an instance's plan took off it: offloads move on (§5.3), drops end."""
        now = time.time()
        offloaded = [r for rid in sc.offloaded if (r := self._at(rid, sc.instance_id))]
        dropped = []
        for d in sc.dropped:
            if (r := self._at(d.request_id, sc.instance_id)) is not None:
                r.drop_reason = d.reason or None
                dropped.append(r)
        self._push(self.ctl.on_scheduled(sc.instance_id, offloaded, dropped, now), now)

    def _at(self, rid: str, instance_id: str) -> Request | None:
        """The request if the Controller has it on ``instance_id`` (else stale news)."""
        return self.requests.get(rid) if self.ctl.location.get(rid) == instance_id else None

    def _push(self, actions: Iterable[Action], now: float) -> None:
        """Each action to the frontend that owns its request."""
        out: dict[str, router_pb2.RouterOutput] = defaultdict(router_pb2.RouterOutput)
        for a in actions:
            if self.decision_log is not None:
                self.decision_log.write(json.dumps({**action_record(a), "time": now}) + "\n")
                self.decision_log.flush()
            req = self.requests.get(a.request_id)
            fid = self.owner.get(a.request_id, "")
            if isinstance(a, Dispatch):
                out[fid].actions.add(
                    request_id=a.request_id,
                    instance_id=a.instance_id,
                    cause=a.cause,
                    num_offloads=req.num_offloads if req else 0,
                )
            else:
                out[fid].actions.add(request_id=a.request_id, reason=a.reason)
                self._forget(a.request_id)
        for fid, msg in out.items():
            if (q := self.frontends.get(fid)) is not None:
                q.put_nowait(msg)

    def _forget(self, rid: str) -> None:
        self.owner.pop(rid, None)
        self.requests.pop(rid, None)

    # --- schedulers -----------------------------------------------------------------
    def on_output(self, instance_id: str, out: scheduler_pb2.SchedulerOutput) -> None:
        """First tokens free tickets, last ones end requests; state reports feed routing."""
        if instance_id not in self.links:
            return  # it left the deployment
        self.ctl.on_tokens(out.tokens)
        for t in out.tokens:
            if t.finished:
                self._forget(t.request_id)
        if out.HasField("state"):
            s = out.state
            self.ctl.on_instance_state(
                s.instance_id,
                s.num_waiting_prefills,
                out.time or time.time(),
                offers_ticket=not s.declines_ticket,
            )

    def on_health(self, instance_id: str, serving: bool) -> None:
        """As the one gateway's (``gateway.server``): the Controller decides; re-runs go to
        their frontends, and are cancelled on the lost instance."""
        now = time.time()
        if instance_id not in self.links:
            return  # it left the deployment: no news of it counts
        if serving:
            self.ctl.on_instance_back(instance_id, now)
            self.log.info("instance_back", instance=instance_id, at=now)
            return
        actions = self.ctl.on_instance_lost(instance_id, now)
        self.log.warning(
            "instance_lost",
            instance=instance_id,
            at=now,
            rerun=sum(isinstance(a, Dispatch) for a in actions),
        )
        for a in actions:
            if isinstance(a, Dispatch):
                self.links[instance_id].cancel(a.request_id)
        self._push(actions, now)


async def serve(args: argparse.Namespace) -> None:
    dep = deployment_flags.resolve_into(args)
    found = await find_instances(args)  # --scheduler and the registry, as the gateway
    controller = Controller(
        [(i, s.role) for i, s in found.statuses.items()],
        prefix_router=prefix_router(dep, found.statuses),
    )
    log = open(args.decision_log, "a") if args.decision_log else None
    svc = RouterService(controller, found.addresses, log, found.statuses)
    server, _ = await rpc.start_server(
        args.host,
        args.port,
        SERVICE_NAMES["router"],
        lambda s: router_grpc.add_RouterServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    for iid in list(svc.links):
        svc.start_links(iid)
    follow = asyncio.create_task(svc.follow(found.watch, args.connect_timeout))
    svc.log.info("serving", port=args.port, instances=list(found.addresses))
    try:
        await rpc.serve_until_signal(server, [follow])
    finally:
        await found.redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("router")
    p.add_argument(
        "--scheduler",
        action="append",
        default=[],
        metavar="ID=HOST:PORT",
        help="a fixed instance besides those the registry in Redis lists; repeat, or "
        "comma-separate: ID=HOST:PORT,ID=HOST:PORT",
    )
    p.add_argument("--min-instances", type=number(int, 1, strict=False), default=1,
                   metavar="N", help="serve once N schedulers are known (--scheduler + "
                   "registered)")
    p.add_argument("--registry-poll", type=number(float, 0), default=DEFAULT_POLL_S,
                   metavar="SECONDS",
                   help="how often the registry is read for instances joining and leaving")
    deployment_flags.add_deployment_arg(p)
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument(
        "--decision-log",
        default=None,
        help="append the controller's decisions (with the time) as JSON lines",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
