"""A frontend's ``Placement`` (``gateway/placement.py``): asks the router (issue 33, item 2).

It decides nothing: ``admit`` sends the request's ``RouteAsk`` and returns None; the
router's actions (with the request's offload count) come back on the same stream and the
frontend carries them out
(``FrontendService.on_router``). It mirrors only where the frontend's own requests are
(``location``: which scheduler to cancel on, whose tokens to take) and which have their
first token (its ``RouterHello`` after a reconnect says so). While the router is out of
reach a new request is dropped at once (the client may retry on another frontend).
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
        self, target: str, frontend_id: str, on_actions: Callable[[list[tuple[Action, int]]], None]
    ) -> None:
        self.frontend_id, self._on_actions = frontend_id, on_actions
        self.location: dict[str, str] = {}  # this frontend's requests only
        self.started: set[str] = set()  # ... that have their first token
        self.pending: set[str] = set()  # asked, not yet answered
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
                    if not self.connected.is_set():
                        self.connected.set()
                        backoff = 0.05
                        self.log.info("router_connected", inflight=len(hello.inflight))
                    if out.actions:
                        self._on_actions([(_action(a), a.num_offloads) for a in out.actions])
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
