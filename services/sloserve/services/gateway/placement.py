"""What the gateway's request path asks of whoever places requests (issue 33, item 2).

The one gateway (``--frontends 1``) holds the core ``Controller`` itself; a frontend of
several holds a ``RouterClient`` (``sloserve.services.frontend.router_client``) that asks
the router's Controller and mirrors only where its own requests are. ``admit`` may answer
at once (the Controller) or later (the router's actions, carried out as they arrive: None).
Membership is part of the seam: an instance joining or leaving (the registry) and a
restored request adopted go to the Controller where it is held, and are the router's
news for a frontend (its instances come from the router's stream, ``InstanceEvent``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from sloserve.controller import Action, TokenLike
from sloserve.request import Request
from sloserve.routing_prefix import PrefixRouter


class Placement(Protocol):
    location: dict[str, str]  # request id -> the instance holding it
    prefix_router: PrefixRouter | None

    def requests_on(self, instance_id: str) -> list[str]: ...
    def admit(self, req: Request, now: float) -> Action | None: ...
    def on_tokens(self, tokens: Iterable[TokenLike]) -> None: ...
    def on_scheduled(
        self, instance_id: str, offloaded: Iterable[Request], dropped: Iterable[Request], now: float
    ) -> list[Action]: ...
    def on_instance_state(
        self, instance_id: str, num_waiting_prefills: int, now: float, *, offers_ticket: bool = True
    ) -> None: ...
    def on_cancel(self, request_id: str, now: float) -> None: ...
    def on_instance_lost(self, instance_id: str, now: float) -> list[Action]: ...
    def on_instance_back(self, instance_id: str, now: float) -> None: ...
    def on_instance_joined(self, instance_id: str, role: str, now: float) -> None: ...
    def on_instance_left(self, instance_id: str, now: float) -> list[Action]: ...
    def on_restored(self, request_id: str, instance_id: str, now: float) -> None: ...
