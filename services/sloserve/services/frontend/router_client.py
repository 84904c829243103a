"""A frontend's ``Placement`` (``gateway/placement.py``): asks the router (issue 33, item 2).

It decides nothing: ``admit`` sends the request's ``RouteAsk`` and returns None; the
router's actions (with the request's offload count) come back on the same stream and the
frontend carries them out
(``FrontendService.on_router``). It mirrors only where the frontend's own requests are
(``location``: which scheduler to cancel on, whose tokens to take) and which have their
first token (its ``RouterHello`` after a reconnect says so). While the router is out of
reach a new request is dropped at once (the client may retry on another frontend).

Membership is the router's too: it follows the registry, and its stream says which
instances there are (``InstanceEvent``: a snapshot first on every connection, then each
join and leave, in order with the actions), which ``on_instances`` opens and closes the
frontend's scheduler streams from. A restored request the frontend adopts is reported
(``placed``): the router's Controller places it as the one gateway's does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
import structlog

from sloserve.controller import Action, Dispatch, Drop, TokenLike
from sloserve.request import Request
from sloserve.routing_prefix import PrefixRouter
from sloserve.services import rpc
from sloserve.services.proto import router_grpc, router_pb2

ROUTER_DOWN = "the router is out of reach: try again"
MAX_BACKOFF_S = 0.25


class RouterClient:
    prefix_router: PrefixRouter | None = None  # the router's; the frontend only hashes

    def __init__(
        self, target: str, frontend_id: str, on_actions: Callable[[list[tuple[Action, int]]], None],
        on_instances: Callable[[router_pb2.RouterOutput], None] | None = None,
    ) -> None:
        self.frontend_id, self._on_actions = frontend_id, on_actions
        self.on_instances = on_instances  # membership news (None: kept in ``snapshot``)
        self.snapshot: dict[str, router_pb2.InstanceEvent] = {}  # the first one received
        self.location: dict[str, str] = {}  # this frontend's requests only
        self.started: set[str] = set()  # ... that have their first token
        self.pending: set[str] = set()  # asked, not yet answered
        # a handover the router asks for: this frontend's answer (``FrontendService``)
        self.on_handover: Callable[[str], router_pb2.Handover] | None = None
        self._locating: dict[str, asyncio.Future[router_pb2.Handover]] = {}
        self._q: asyncio.Queue[router_pb2.RouterInput | None] | None = None
        self.connected = asyncio.Event()
        self.stub = router_grpc.RouterStub(rpc.channel(target))
        self.log = structlog.get_logger().bind(service="frontend", router=target)

    # --- Placement --------------------------------------------------------------------
    def requests_on(self, instance_id: str) -> list[str]:
        return [r for r, i in self.location.items() if i == instance_id]

    def admit(self, req: Request, now: float) -> Action | None:
        ask = router_pb2.RouteAsk(
            request_id=req.request_id,
            arrival_time=req.arrival_time,
            prompt_len=req.prompt_len,
            max_tokens=req.output_len,
            priority=req.priority,
            hash_ids=req.hash_ids or (),
            hash_unit=req.hash_unit if req.hash_ids else 0,
        )
        if not self._send(router_pb2.RouterInput(route=ask, time=now)):
            return Drop(req.request_id, ROUTER_DOWN)
        self.pending.add(req.request_id)
        return None

    def on_tokens(self, tokens: Iterable[TokenLike]) -> None:
        for t in tokens:
            if t.finished:
                self.location.pop(t.request_id, None)
                self.started.discard(t.request_id)
            elif t.index == 0:
                self.started.add(t.request_id)

    def on_scheduled(
        self, instance_id: str, offloaded: Iterable[Request], dropped: Iterable[Request], now: float
    ) -> list[Action]:
        """Told to the router; its actions come back on the stream."""
        sc = router_pb2.Scheduled(
            instance_id=instance_id,
            offloaded=[r.request_id for r in offloaded],
            dropped=[
                router_pb2.DroppedRequest(request_id=r.request_id, reason=r.drop_reason or "")
                for r in dropped
            ],
        )
        self._send(router_pb2.RouterInput(scheduled=sc, time=now))
        return []

    def on_instance_state(
        self, instance_id: str, num_waiting_prefills: int, now: float, *, offers_ticket: bool = True
    ) -> None:
        """The router hears every state report itself."""

    def on_cancel(self, request_id: str, now: float) -> None:
        self.forget(request_id)
        self._send(router_pb2.RouterInput(cancel=request_id, time=now))

    def on_instance_lost(self, instance_id: str, now: float) -> list[Action]:
        return []  # the router watches health; its re-runs come on the stream

    def on_instance_back(self, instance_id: str, now: float) -> None:
        """The router watches health."""

    def on_instance_joined(self, instance_id: str, role: str, now: float) -> None:
        """The router's news (it took the instance in before telling us)."""

    def on_instance_left(self, instance_id: str, now: float) -> list[Action]:
        return []  # the router sent the re-runs of our requests there before the leave

    def on_restored(self, request_id: str, instance_id: str, now: float) -> None:
        """A restored request this frontend adopted: the router places it (as
        ``Controller.on_restored``: no ticket)."""
        self.location[request_id] = instance_id
        self.started.add(request_id)
        placed = router_pb2.Placement(request_id=request_id, instance_id=instance_id,
                                      started=True)
        self._send(router_pb2.RouterInput(placed=placed, time=now))

    async def locate(self, request_id: str, timeout: float) -> router_pb2.Handover:
        """Ask the router for ``request_id``, held by another frontend: handed over to this
        one (``instance_id`` set: claim it there) or not (``reason``)."""
        fut: asyncio.Future[router_pb2.Handover] = asyncio.get_running_loop().create_future()
        self._locating[request_id] = fut
        try:
            if not self._send(router_pb2.RouterInput(locate=request_id)):
                return router_pb2.Handover(request_id=request_id, reason=ROUTER_DOWN)
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return router_pb2.Handover(request_id=request_id, reason="the router did not "
                                       f"answer in {timeout:g} s")
        finally:
            self._locating.pop(request_id, None)

    def _handovers(self, out: router_pb2.RouterOutput) -> None:
        for rid in out.handover:
            h = (self.on_handover(rid) if self.on_handover is not None else
                 router_pb2.Handover(request_id=rid, reason="not serving yet"))
            self._send(router_pb2.RouterInput(handed=h))
        for h in out.located:
            if (fut := self._locating.get(h.request_id)) is not None and not fut.done():
                fut.set_result(h)

    # --- the stream ---------------------------------------------------------------------
    def placed(self, action: Action) -> None:
        """Mirror one of the router's actions on a request this frontend still holds."""
        self.pending.discard(action.request_id)
        if isinstance(action, Dispatch):
            self.location[action.request_id] = action.instance_id
        else:
            self.forget(action.request_id)

    def forget(self, request_id: str) -> None:
        self.location.pop(request_id, None)
        self.started.discard(request_id)
        self.pending.discard(request_id)

    def _send(self, msg: router_pb2.RouterInput) -> bool:
        if self._q is None or not self.connected.is_set():
            return False
        self._q.put_nowait(msg)
        return True

    async def run(self) -> None:
        """The stream to the router, reconnected for ever; its ``RouterHello`` lists where
        this frontend's requests are (a restarted router learns them)."""
        backoff = 0.05
        while True:
            q: asyncio.Queue[router_pb2.RouterInput | None] = asyncio.Queue()
            hello = router_pb2.RouterHello(
                frontend_id=self.frontend_id,
                inflight=[
                    router_pb2.Placement(request_id=r, instance_id=i, started=r in self.started)
                    for r, i in self.location.items()
                ],
            )
            q.put_nowait(router_pb2.RouterInput(hello=hello))
            self._q = q
            try:
                async for out in self.stub.Control(_drain(q)):
                    if out.instances or out.snapshot:
                        self._instances(out)
                    if not self.connected.is_set():
                        self.connected.set()
                        backoff = 0.05
                        self.log.info("router_connected", inflight=len(hello.inflight),
                                      instances=len(out.instances))
                    if out.actions:
                        self._on_actions([(_action(a), a.num_offloads) for a in out.actions])
                    if out.handover or out.located:
                        self._handovers(out)
                    if self.on_instances is not None and any(e.left for e in out.instances):
                        self.on_instances(_leaves(out))
            except grpc.aio.AioRpcError as exc:
                self.log.warning("router_stream_broken", code=exc.code().name)
            finally:
                self._q = None
                self.connected.clear()
                q.put_nowait(None)
            lost, self.pending = self.pending, set()
            if lost:  # asked and never answered: the router may never have seen them
                self._on_actions([(Drop(r, ROUTER_DOWN), 0) for r in lost])
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)


    def _instances(self, out: router_pb2.RouterOutput) -> None:
        """Joins (or a snapshot) before the actions of the same message; leaves after.
        Before the frontend is built (``on_instances`` None) they make ``snapshot``."""
        if self.on_instances is None:
            if out.snapshot:
                self.snapshot = {}
            for e in out.instances:
                if e.left:
                    self.snapshot.pop(e.instance_id, None)
                else:
                    self.snapshot[e.instance_id] = e
            return
        if out.snapshot or any(not e.left for e in out.instances):
            joins = router_pb2.RouterOutput(snapshot=out.snapshot)
            joins.instances.extend(e for e in out.instances if not e.left)
            self.on_instances(joins)


def _leaves(out: router_pb2.RouterOutput) -> router_pb2.RouterOutput:
    leaves = router_pb2.RouterOutput()
    leaves.instances.extend(e for e in out.instances if e.left)
    return leaves


def _action(a: router_pb2.RouterAction) -> Action:
    if a.instance_id:
        cause = a.cause if a.cause in ("route", "ticket", "offload", "rerun") else "route"
        return Dispatch(a.request_id, a.instance_id, cause)  # type: ignore[arg-type]
    return Drop(a.request_id, a.reason)


async def _drain(
    q: asyncio.Queue[router_pb2.RouterInput | None],
) -> AsyncIterator[router_pb2.RouterInput]:
    while (msg := await q.get()) is not None:
        yield msg
