"""The LP waiting queue in value order without a per-iteration sort (Ascendra §5.2).

A binary heap of ``(value key, seq, request)`` entries. Keys are the value
function of ``(request, Phi(request))`` and do not change while a request
waits (see ``value_functions``: time in system enters every slack through the
same ``now``), so heap order stays the value order between iterations. Two
things do change a key, and both are handled:

* ``Phi`` is refitted online: each ``sync`` predicts one fixed probe batch;
  when the prediction differs from the last one, every key is recomputed and
  the heap rebuilt (O(n), only at refits).
* A preempted request returns with more tokens to recompute: it left the
  waiting queue when admitted, so it re-enters with a fresh key.

``sync(waiting)`` reconciles the heap with the instance's waiting queue. It is
incremental (issue 14: no per-iteration full scan): the policy tells the queue
which requests joined the waiting queue (``join``: arrivals at its back,
``join_front``: requests preempted back to its front), and only those are keyed.
When the counts say the waiting queue also changed behind the queue's back (a
waiting request cancelled, or dropped without surfacing), it falls back to the
full reconciliation (O(n) set operations, no sort). Either way the new entries
are keyed in waiting-queue order, so tie-breaks, and with them decisions, are
those of a full reconciliation. A re-key after a refit predicts ``Phi`` once per
distinct ``(uncomputed, computed)`` shape (waiting requests share prompt lengths).
Entries of requests that left are skipped lazily when they surface. ``pop`` yields
requests in value order; the caller ``push_back``s those it did not take.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Collection, Iterable

from sloserve.batch import BatchShape
from sloserve.perf.base import PerfModel
from sloserve.policies.value_functions import SortKey, ValueFunction
from sloserve.request import Request, RequestStatus

_PROBE = BatchShape(prefills=((512, 0),))

Entry = tuple[SortKey, int, Request, float]  # key, tie-break, request, Phi(request)


def prefill_time(model: PerfModel, req: Request) -> float:
    """``Phi(w)``: predicted time of ``req``'s remaining prefill run alone."""
    return model.predict(BatchShape(prefills=((req.num_uncomputed, req.num_computed),)))


class ValueQueue:
    """``incremental=False``: every ``sync`` is a full reconciliation (the reference the
    incremental one is tested against)."""

    def __init__(self, value: ValueFunction, incremental: bool = True) -> None:
        self.value = value
        self.incremental = incremental
        self._heap: list[Entry] = []
        self._live: dict[str, Entry] = {}
        self._seq = itertools.count()
        self._probe = float("nan")
        self._joined: deque[Request] = deque()  # joined the waiting queue since the last sync
        self._phi_count: dict[float, int] = {}  # Phi of the live entries -> how many
        self._phi_top: list[float] = []  # -Phi, a max-heap over the counted values (lazy)
        self.num_rekeys = 0
        self.num_full_syncs = 0  # reconciliations that scanned the whole waiting queue

    def __len__(self) -> int:
        return len(self._live)

    def _entry(self, model: PerfModel, req: Request,
               memo: dict[tuple[int, int], float] | None = None) -> Entry:
        if memo is None:
            phi = prefill_time(model, req)
        else:  # a re-key: the same shape predicts the same Phi
            shape = (req.num_uncomputed, req.num_computed)
            phi = memo.get(shape, math.nan)
            if phi != phi:
                phi = memo[shape] = prefill_time(model, req)
        return (self.value(req, phi), next(self._seq), req, phi)

    def join(self, req: Request) -> None:
        """``req`` joined the back of the waiting queue (an arrival); keyed at ``sync``."""
        self._joined.append(req)

    def join_front(self, reqs: Iterable[Request]) -> None:
        """``reqs`` (in their queue order) went back to the front of the waiting queue
        (preempted by recompute); keyed at ``sync`` with their new progress."""
        self._joined.extendleft(reversed(list(reqs)))

    def sync(self, waiting: Collection[Request], model: PerfModel) -> None:
        """Make the heap hold exactly ``waiting``; re-key everything if ``Phi`` changed."""
        probe = model.predict(_PROBE)
        rekey = probe != self._probe
        self._probe = probe
        joined, self._joined = self._joined, deque()
        live = self._live
        if not rekey and self.incremental:
            fresh: dict[str, Request] = {}
            for r in joined:  # in waiting-queue order, as the full reconciliation keys them
                if r.status is RequestStatus.WAITING:
                    e = live.get(r.request_id)
                    if e is None or e[2] is not r:
                        fresh.pop(r.request_id, None)
                        fresh[r.request_id] = r
            added = sum(1 for rid in fresh if rid not in live)
            if len(live) + added == len(waiting):  # nothing changed behind our back
                for rid, r in fresh.items():
                    e = self._entry(model, r)
                    self._put(rid, e)
                    heapq.heappush(self._heap, e)
                self._compact()
                return
        self.num_full_syncs += 1
        current = {r.request_id: r for r in waiting}
        for rid in [rid for rid in live if rid not in current]:
            self.discard(live[rid][2])
        if rekey:
            self.num_rekeys += 1
            memo: dict[tuple[int, int], float] = {}
            self._live = {rid: self._entry(model, r, memo) for rid, r in current.items()}
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)
            self._phi_count = {}
            for e in self._heap:
                self._phi_count[e[3]] = self._phi_count.get(e[3], 0) + 1
            self._phi_top = [-phi for phi in self._phi_count]
            heapq.heapify(self._phi_top)
            return
        for rid, r in current.items():
            e = live.get(rid)
            if e is None or e[2] is not r:
                e = self._entry(model, r)
                self._put(rid, e)
                heapq.heappush(self._heap, e)
        self._compact()

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + 64:  # drop stale entries
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def pop(self) -> Entry | None:
        """The next live entry in value order (removed from the heap), or ``None``."""
        while self._heap:
            e = heapq.heappop(self._heap)
            if self._live.get(e[2].request_id) is e:
                return e
        return None

    def push_back(self, entries: Iterable[Entry]) -> None:
        for e in entries:
            if self._live.get(e[2].request_id) is e:
                heapq.heappush(self._heap, e)

    def _put(self, rid: str, e: Entry) -> None:
        old = self._live.get(rid)
        if old is not None:
            self._uncount(old[3])
        self._live[rid] = e
        n = self._phi_count.get(e[3], 0)
        if n == 0:
            heapq.heappush(self._phi_top, -e[3])
        self._phi_count[e[3]] = n + 1

    def _uncount(self, phi: float) -> None:
        n = self._phi_count[phi] - 1
        if n:
            self._phi_count[phi] = n
        else:
            del self._phi_count[phi]  # its heap entry goes lazily

    def discard(self, req: Request) -> None:
        e = self._live.pop(req.request_id, None)
        if e is not None:
            self._uncount(e[3])

    def max_prefill_time(self) -> float:
        """The largest ``Phi`` waiting (a max-heap of distinct values with counts)."""
        top, count = self._phi_top, self._phi_count
        while top and -top[0] not in count:
            heapq.heappop(top)
        return -top[0] if top else 0.0
