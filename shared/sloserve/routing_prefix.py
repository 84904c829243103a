"""Prefix-aware routing: send a request where its prefix is cached, within a load bound.

As SGLang's cache-aware router (and llm-d's prefix-cache scorer) do, the
router does not ask the instances what they cache: it remembers, per instance,
the prefixes it sent there (an approximate cache, LRU-bounded to the
instance's KV capacity) and scores each instance by the number of leading
``PREFIX_UNIT`` units of the request found there. Among the instances whose
load (waiting prefills, as the controller counts them) is within
``load_bound`` of the least loaded one, the longest match wins; ties go to
the least loaded, then round-robin. With no match anywhere it is plain
least-loaded routing, so new conversations spread out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from sloserve.request import Request


def unit_keys(hash_ids: Sequence[int]) -> list[int]:
    """Chained keys of a request's leading units: key j names units 0..j."""
    out, parent = [], 0
    for h in hash_ids:
        parent = hash((parent, h))
        out.append(parent)
    return out


class PrefixRouter:
    def __init__(self, instance_ids: Sequence[str], *, capacity_units: int,
                 load_bound: int = 4) -> None:
        if capacity_units < 1:
            raise ValueError(f"capacity_units: must be >= 1, got {capacity_units}")
        if load_bound < 0:
            raise ValueError(f"load_bound (--prefix-load-bound): must be >= 0, got {load_bound}")
        self.capacity_units = capacity_units
        self.load_bound = load_bound
        self._seen: dict[str, OrderedDict[int, None]] = {i: OrderedDict() for i in instance_ids}
        self._next = 0
        self.num_matched = 0  # requests sent to an instance that had some of their prefix

    def add(self, instance_id: str) -> None:
        """A new instance (it joined the deployment) with nothing cached yet."""
        self._seen.setdefault(instance_id, OrderedDict())

    def remove(self, instance_id: str) -> None:
        """Forget an instance that left (and its cache)."""
        self._seen.pop(instance_id, None)

    def match(self, instance_id: str, keys: Sequence[int]) -> int:
        seen, n = self._seen[instance_id], 0
        for k in keys:
            if k not in seen:
                break
            n += 1
        return n

    def choose(self, req: Request, pool: Sequence[str], load: Mapping[str, int]) -> str:
        """The instance for ``req`` among ``pool`` (non-empty); remembers the choice."""
        keys = unit_keys(req.hash_ids or ())
        least = min(load[i] for i in pool)
        n = len(pool)
        order = [pool[(self._next + k) % n] for k in range(n)]
        self._next += 1
        best = max((i for i in order if load[i] <= least + self.load_bound),
                   key=lambda i: (self.match(i, keys), -load[i]))
        if self.match(best, keys):
            self.num_matched += 1
        seen = self._seen[best]
        for k in keys:
            seen[k] = None
            seen.move_to_end(k)
        while len(seen) > self.capacity_units:
            seen.popitem(last=False)
        return best
