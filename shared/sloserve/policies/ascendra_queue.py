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

``sync(waiting)`` reconciles the heap with the instance's waiting queue
(O(n) set operations, no sort); entries of requests that left are skipped
lazily when they surface. ``pop`` yields requests in value order; the caller
``push_back``s those it did not take.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from sloserve.batch import BatchShape
from sloserve.perf.base import PerfModel
from sloserve.policies.value_functions import SortKey, ValueFunction
from sloserve.request import Request

_PROBE = BatchShape(prefills=((512, 0),))

Entry = tuple[SortKey, int, Request, float]  # key, tie-break, request, Phi(request)


def prefill_time(model: PerfModel, req: Request) -> float:
    """``Phi(w)``: predicted time of ``req``'s remaining prefill run alone."""
    return model.predict(BatchShape(prefills=((req.num_uncomputed, req.num_computed),)))


class ValueQueue:
    def __init__(self, value: ValueFunction) -> None:
        self.value = value
        self._heap: list[Entry] = []
        self._live: dict[str, Entry] = {}
        self._seq = itertools.count()
        self._probe = float("nan")
        self.num_rekeys = 0

    def __len__(self) -> int:
        return len(self._live)

    def _entry(self, model: PerfModel, req: Request) -> Entry:
        phi = prefill_time(model, req)
        return (self.value(req, phi), next(self._seq), req, phi)

    def sync(self, waiting: Iterable[Request], model: PerfModel) -> None:
        """Make the heap hold exactly ``waiting``; re-key everything if ``Phi`` changed."""
        probe = model.predict(_PROBE)
        rekey = probe != self._probe
        self._probe = probe
        current = {r.request_id: r for r in waiting}
        for rid in [rid for rid in self._live if rid not in current]:
            del self._live[rid]
        if rekey:
            self.num_rekeys += 1
            self._live = {rid: self._entry(model, r) for rid, r in current.items()}
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)
            return
        for rid, r in current.items():
            e = self._live.get(rid)
            if e is None or e[2] is not r:
                e = self._entry(model, r)
                self._live[rid] = e
                heapq.heappush(self._heap, e)
        if len(self._heap) > 2 * len(self._live) + 64:  # compact stale entries
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

    def discard(self, req: Request) -> None:
        self._live.pop(req.request_id, None)

    def max_prefill_time(self) -> float:
        return max((e[3] for e in self._live.values()), default=0.0)
