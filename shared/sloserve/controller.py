"""The multi-instance controller: every transition between instances, as pure methods.

Ascendra's controller (§4, §6.1) generalised to every policy. It owns where
each request is, which HP holds a ticket and which instances may take work;
it performs no I/O and has no clock (callers pass ``now``). The simulator and
the gateway call the same methods and only carry out the returned actions:

* :class:`Dispatch` — put the request on ``instance_id`` (a new arrival, an
  offload, or a re-run after its instance was lost);
* :class:`Drop` — end the request as dropped (an SLO miss) with ``reason``.

Rules:

* New requests go to an HP holding a ticket, else round-robin over the
  healthy LP instances (over every healthy instance when there is no LP). An
  HP holds a ticket when its last reported waiting-prefill count is zero,
  no ticketed request of its own is still before its first token (§6.1:
  "only one ticketed request is allowed at a time") and its last report
  offered one (``offers_ticket``: KV to spare, §8.5); ``ticket_entry=False``
  keeps new requests off HP.
* Offloads go round-robin over the healthy HP instances (§4: "within each
  pool, requests are assigned to instances in a round-robin manner"). With no
  HP to take it an offloaded request is dropped (an offload is a request
  about to miss).
* A request the policy drops ends as a drop; a cancelled or finished one
  is forgotten; a first token (or leaving the HP before it) frees its ticket.
* A lost instance takes no new work; its requests are re-run elsewhere
  (prefill restarts; decodes resume by recomputing prompt + generated tokens).
  With no healthy instance left they stay where they are and resume when it
  comes back (dropping accepted work would turn a pause into a loss).
* Membership changes (issue 34, item 2: the instance registry): a joined instance
  takes work at once in its role's pool; an instance that left is lost for good —
  its requests re-run elsewhere as on a loss, those with nowhere to go end as drops
  (it will not come back to resume them), and it is forgotten.

Routing to an instance counts one more waiting prefill there until its next
state report, so a stale report never lets two tickets out at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sloserve.request import Request
from sloserve.routing_prefix import PrefixRouter

DROP_BY_POLICY = "dropped by the policy under overload (Ascendra §6.3)"
DROP_NO_HP = "offloaded with no healthy HP instance to take it"
DROP_NO_INSTANCE = "no healthy instance to run it"
DROP_LEFT = "its instance left the deployment and no healthy instance remains"


Cause = Literal["route", "ticket", "offload", "rerun"]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Put ``request_id`` on ``instance_id``."""

    request_id: str
    instance_id: str
    cause: Cause


@dataclass(frozen=True, slots=True)
class Drop:
    """End ``request_id`` as dropped; ``reason`` is what the client is told."""

    request_id: str
    reason: str


Action = Dispatch | Drop


class TokenLike(Protocol):
    """A produced token as the controller needs it (core ``TokenEvent`` or a wire message)."""

    @property
    def request_id(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def finished(self) -> bool: ...


class Controller:
    """Routing, tickets, offloads, drops and instance loss for one set of instances."""

    def __init__(
        self, instances: Sequence[tuple[str, str]], *, ticket_entry: bool = True,
        record: bool = False, prefix_router: PrefixRouter | None = None,
    ) -> None:
        """``instances``: ``(instance_id, role)`` pairs, role ``"lp"`` or ``"hp"``;
        ``prefix_router``: new requests with a prefix identity go where their prefix is
        cached, within a load bound (``sloserve.routing_prefix``), instead of round-robin."""
        ids = [i for i, _ in instances]
        if not ids:
            raise ValueError("instances: at least one instance is required")
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"instances: instance ids must be unique, repeated: {dup}")
        bad = sorted({r for _, r in instances if r not in ("lp", "hp")})
        if bad:
            raise ValueError(f"instances: role must be 'lp' or 'hp', got {bad}")
        self.lp = [i for i, r in instances if r == "lp"]
        self.hp = [i for i, r in instances if r == "hp"]
        self.ticket_entry = ticket_entry
        self.healthy = set(ids)
        self.location: dict[str, str] = {}  # request id -> instance holding it
        self.waiting_prefills: dict[str, int] = dict.fromkeys(ids, 0)
        self.ticket_holder: dict[str, str | None] = dict.fromkeys(self.hp)
        self.offers_ticket: dict[str, bool] = dict.fromkeys(ids, True)
        self._next_new = 0
        self._next_hp = 0
        self._next_offload = 0
        self.decisions: list[Action] | None = [] if record else None
        self.prefix_router = prefix_router

    # --- queries ------------------------------------------------------------------
    def has_ticket(self, hp_id: str) -> bool:
        return (hp_id in self.healthy and self.waiting_prefills[hp_id] == 0
                and self.ticket_holder[hp_id] is None and self.offers_ticket[hp_id])

    def requests_on(self, instance_id: str) -> list[str]:
        return [r for r, i in self.location.items() if i == instance_id]

    # --- transitions -------------------------------------------------------------
    def admit(self, req: Request, now: float) -> Action:
        """A new request: a ticketed HP if any, else the next healthy LP."""
        if self.ticket_entry and self.lp:
            n = len(self.hp)
            for k in range(n):
                hp_id = self.hp[(self._next_hp + k) % n]
                if self.has_ticket(hp_id):
                    self._next_hp = (self._next_hp + k + 1) % n
                    self.ticket_holder[hp_id] = req.request_id
                    return self._dispatch(req.request_id, hp_id, "ticket")
        pool = [i for i in (self.lp or self.hp) if i in self.healthy]
        if not pool:
            pool = [i for i in self.hp if i in self.healthy]  # every LP lost: HP serves all
        if not pool:
            return self._drop(req.request_id, DROP_NO_INSTANCE)
        if self.prefix_router is not None and req.hash_ids is not None:
            target = self.prefix_router.choose(req, pool, self.waiting_prefills)
        else:
            target = pool[self._next_new % len(pool)]
            self._next_new += 1
        return self._dispatch(req.request_id, target, "route")

    def on_scheduled(
        self, instance_id: str, offloaded: Iterable[Request], dropped: Iterable[Request],
        now: float,
    ) -> list[Action]:
        """What an instance's plan took off it: offloads move to an HP (§5.3), drops end."""
        actions: list[Action] = []
        for req in offloaded:
            self._leave_prefill(req.request_id)
            target = self._offload_target()
            if target is None:
                actions.append(self._drop(req.request_id, DROP_NO_HP))
            else:
                req.num_offloads += 1
                actions.append(self._dispatch(req.request_id, target, "offload"))
        for req in dropped:
            self._leave_prefill(req.request_id)
            actions.append(self._drop(req.request_id, req.drop_reason or DROP_BY_POLICY))
        return actions

    def on_tokens(self, tokens: Iterable[TokenLike]) -> None:
        """Produced tokens: a first token frees its HP ticket, a last one ends the request."""
        for t in tokens:
            if t.index == 0:
                self._leave_prefill(t.request_id)
            if t.finished:
                self.location.pop(t.request_id, None)

    def on_instance_state(self, instance_id: str, num_waiting_prefills: int, now: float,
                          *, offers_ticket: bool = True) -> None:
        """An instance's queue after an iteration (or when idle); an empty HP may issue a
        ticket when it ``offers_ticket`` (its KV has room beyond expected decodes, §8.5)."""
        if instance_id not in self.waiting_prefills:
            raise ValueError(f"instance_id: unknown instance {instance_id!r}")
        if num_waiting_prefills < 0:
            raise ValueError(f"num_waiting_prefills: must be >= 0, got {num_waiting_prefills}")
        self.waiting_prefills[instance_id] = num_waiting_prefills
        self.offers_ticket[instance_id] = offers_ticket

    def on_cancel(self, request_id: str, now: float) -> None:
        """The client went away: forget the request and free its ticket."""
        self._leave_prefill(request_id)
        self.location.pop(request_id, None)

    def on_restored(self, request_id: str, instance_id: str, now: float) -> None:
        """A request ``instance_id`` restored from Redis after a whole-stack restart (issue
        34, item 6): it stays where it was (its queue already counts it)."""
        if instance_id not in self.waiting_prefills:
            raise ValueError(f"instance_id: unknown instance {instance_id!r}")
        self.location[request_id] = instance_id

    def on_placed(self, request_id: str, instance_id: str, started: bool) -> None:
        """A request already on ``instance_id`` that this controller did not place (the
        router restarted and a frontend re-announces it, issue 33): where it is; an HP
        request before its first token holds that HP's ticket (never two at once)."""
        if instance_id not in self.waiting_prefills:
            raise ValueError(f"instance_id: unknown instance {instance_id!r}")
        self.location[request_id] = instance_id
        if not started and instance_id in self.ticket_holder and self.lp:
            self.ticket_holder[instance_id] = request_id

    def on_instance_lost(self, instance_id: str, now: float) -> list[Action]:
        """``instance_id`` is dead or hung: no new work, its requests re-run elsewhere."""
        if instance_id not in self.waiting_prefills:
            raise ValueError(f"instance_id: unknown instance {instance_id!r}")
        self.healthy.discard(instance_id)
        actions: list[Action] = []
        for rid in self.requests_on(instance_id):
            pool = [i for i in (self.lp or self.hp) if i in self.healthy] or sorted(self.healthy)
            if not pool:  # nowhere else to go: it waits for its instance to come back
                continue
            self._leave_prefill(rid)
            target = pool[self._next_new % len(pool)]
            self._next_new += 1
            actions.append(self._dispatch(rid, target, "rerun"))
        return actions

    def on_instance_back(self, instance_id: str, now: float) -> None:
        """A lost instance is healthy again; it holds only the requests that had nowhere
        else to go (the rest were re-run elsewhere and cancelled there)."""
        if instance_id not in self.waiting_prefills:
            raise ValueError(f"instance_id: unknown instance {instance_id!r}")
        self.healthy.add(instance_id)
        self.waiting_prefills[instance_id] = 0

    def on_instance_joined(self, instance_id: str, role: str, now: float) -> None:
        """A new instance registered (issue 34, item 2): it takes work from now on, in
        the ``role`` (``"lp"`` or ``"hp"``) pool."""
        if instance_id in self.waiting_prefills:
            raise ValueError(f"instance_id: {instance_id!r} is already a member")
        if role not in ("lp", "hp"):
            raise ValueError(f"role: must be 'lp' or 'hp', got {role!r}")
        (self.lp if role == "lp" else self.hp).append(instance_id)
        if role == "hp":
            self.ticket_holder[instance_id] = None
        self.healthy.add(instance_id)
        self.waiting_prefills[instance_id] = 0
        self.offers_ticket[instance_id] = True
        if self.prefix_router is not None:
            self.prefix_router.add(instance_id)

    def on_instance_left(self, instance_id: str, now: float) -> list[Action]:
        """``instance_id`` left the deployment (deregistered, or its heartbeat expired):
        the instance-lost transition re-runs its requests elsewhere; those with nowhere to
        go are dropped, since it never comes back; then it is forgotten."""
        actions = self.on_instance_lost(instance_id, now)
        for rid in self.requests_on(instance_id):
            self._leave_prefill(rid)
            actions.append(self._drop(rid, DROP_LEFT))
        for pool in (self.lp, self.hp):
            if instance_id in pool:
                pool.remove(instance_id)
        del self.waiting_prefills[instance_id], self.offers_ticket[instance_id]
        self.ticket_holder.pop(instance_id, None)
        self._next_hp = self._next_hp % len(self.hp) if self.hp else 0
        self._next_offload = self._next_offload % len(self.hp) if self.hp else 0
        if self.prefix_router is not None:
            self.prefix_router.remove(instance_id)
        return actions

    # --- helpers --------------------------------------------------------------------
    def _offload_target(self) -> str | None:
        hp = [i for i in self.hp if i in self.healthy]
        if not hp:
            return None
        n = len(self.hp)
        target = next(i for k in range(n)
                      if (i := self.hp[(self._next_offload + k) % n]) in self.healthy)
        self._next_offload = (self.hp.index(target) + 1) % n
        return target

    def _leave_prefill(self, request_id: str) -> None:
        for hp_id, holder in self.ticket_holder.items():
            if holder == request_id:
                self.ticket_holder[hp_id] = None

    def _dispatch(self, request_id: str, instance_id: str, cause: Cause) -> Dispatch:
        self.waiting_prefills[instance_id] += 1
        self.location[request_id] = instance_id
        action = Dispatch(request_id, instance_id, cause)
        if self.decisions is not None:
            self.decisions.append(action)
        return action

    def _drop(self, request_id: str, reason: str) -> Drop:
        self.location.pop(request_id, None)
        action = Drop(request_id, reason)
        if self.decisions is not None:
            self.decisions.append(action)
        return action
