"""Ascendra's controller (§4, §6.1): routes new requests and LP→HP offloads.

No I/O and no clock: the simulator and the gateway drive it identically.

* New requests go to an HP instance holding a ticket, else round-robin over
  the LP pool (over every instance when there is no LP). An HP holds a ticket
  when its last reported waiting-prefill count is zero and no ticketed
  request of its own is still before its first token (§6.1: "only one
  ticketed request is allowed at a time"). With ``ticket_entry=False`` new
  requests never go to HP.
* Offloads go to the HP with the fewest waiting prefills; ties rotate
  round-robin (§4: round-robin within a pool).

Call contract:

* ``route(req, now)`` on every arrival; ``route_offload(req, now)`` for each
  request a plan offloads (the caller moves it there).
* ``on_instance_state(instance_id, num_waiting_prefills, now)`` after every
  iteration of every instance, and once when one goes idle, with
  ``Instance.num_waiting_prefills``.
* ``on_prefill_done(request_id)`` when a request on an HP produces its first
  token or leaves the HP before it (dropped, cancelled); ids that hold no
  ticket are ignored, so the caller may report every first token.

Routing to an instance counts one more waiting prefill there until its next
report, so a stale report never lets two tickets out at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.request import Request


class Router:
    def __init__(
        self, lp: Sequence[str], hp: Sequence[str] = (), ticket_entry: bool = True
    ) -> None:
        self.lp = list(lp)
        self.hp = list(hp)
        if not self.lp and not self.hp:
            raise ValueError("lp, hp: at least one instance id is required")
        ids = self.lp + self.hp
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"lp, hp: instance ids must be unique, repeated: {dup}")
        self.ticket_entry = ticket_entry
        self._new_pool = self.lp or self.hp
        self._next_new = 0
        self._next_hp = 0
        self.waiting_prefills: dict[str, int] = dict.fromkeys(ids, 0)
        self.ticket_holder: dict[str, str | None] = dict.fromkeys(self.hp)

    def has_ticket(self, hp_id: str) -> bool:
        return self.waiting_prefills[hp_id] == 0 and self.ticket_holder[hp_id] is None

    def route(self, req: Request, now: float) -> str:
        """Instance for a new request: a ticketed HP if any, else the next LP."""
        if self.ticket_entry and self.lp:
            for k in range(len(self.hp)):
                hp_id = self.hp[(self._next_hp + k) % len(self.hp)]
                if self.has_ticket(hp_id):
                    self._next_hp = (self._next_hp + k + 1) % len(self.hp)
                    self.ticket_holder[hp_id] = req.request_id
                    return self._sent(hp_id)
        target = self._new_pool[self._next_new % len(self._new_pool)]
        self._next_new += 1
        return self._sent(target)

    def route_offload(self, req: Request, now: float) -> str:
        """HP instance for a request offloaded by an LP (§5.3)."""
        if not self.hp:
            raise ValueError(
                f"route_offload: no HP instance to offload request {req.request_id!r} to "
                "(router has hp=[]); set offload_threshold=0 on LP policies without HP"
            )
        n = len(self.hp)
        order = [self.hp[(self._next_hp + k) % n] for k in range(n)]
        target = min(order, key=self.waiting_prefills.__getitem__)  # first of the least loaded
        self._next_hp = (self.hp.index(target) + 1) % n
        return self._sent(target)

    def on_instance_state(self, instance_id: str, num_waiting_prefills: int, now: float) -> None:
        """An instance's queue after an iteration (or when idle); an empty HP may issue a ticket."""
        if instance_id not in self.waiting_prefills:
            raise ValueError(f"instance_id: unknown instance {instance_id!r}")
        if num_waiting_prefills < 0:
            raise ValueError(f"num_waiting_prefills: must be >= 0, got {num_waiting_prefills}")
        self.waiting_prefills[instance_id] = num_waiting_prefills

    def on_prefill_done(self, request_id: str) -> None:
        """A request left prefill (first token, drop or cancel); frees its HP's ticket."""
        for hp_id, holder in self.ticket_holder.items():
            if holder == request_id:
                self.ticket_holder[hp_id] = None

    def _sent(self, instance_id: str) -> str:
        self.waiting_prefills[instance_id] += 1
        return instance_id
