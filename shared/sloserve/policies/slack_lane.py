"""``slack``'s background lane (docs/lab/beyond.md, "Our policy" rule 4, "The lane reworked"
and "The lane bounded"): the requests given up on their TTFT but *deferred*, not dropped.

They wait shortest remaining prompt first (SPT: the least mean wait among them) and get
only what on-time work leaves of an iteration — ``late_chunk`` prompt tokens for all of
them together, at most ``late_max_running`` at once. Their decodes sit out an iteration
with on-time prefill work unless their next token is due before the next iteration
(``late_yield``), and set the TBT budget when no on-time decode does, unless that costs
an on-time prompt its TTFT (``late_bound``). The lane is ours; Ascendra §6.3 only drops
under overload."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable

from sloserve.batch import BatchShape
from sloserve.policies.base import BatchBuilder, InstanceView, can_admit
from sloserve.policies.slack_config import SlackConfig
from sloserve.policies.slack_rules import doomed, prefill_allowance, prompt_work, tbt_limit
from sloserve.request import Request, RequestStatus
from sloserve.slo import next_token_deadline


class BackgroundLane:
    """The deferred requests of one instance: those waiting (a heap on remaining prompt
    work) and those admitted and not yet done."""

    __slots__ = ("_heap", "_seq", "_waiting", "running")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Request]] = []  # (prompt work, seq, req)
        self._waiting: set[str] = set()  # ids of deferred requests still waiting
        self.running: dict[str, Request] = {}  # deferred requests admitted, not done
        self._seq = itertools.count()

    def defer(self, req: Request) -> None:
        self._waiting.add(req.request_id)
        heapq.heappush(self._heap, (prompt_work(req), next(self._seq), req))

    def holds(self, rid: str) -> bool:
        """Whether ``rid`` is deferred (waiting or running)."""
        return rid in self._waiting or rid in self.running

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def first_waiting(self) -> Request | None:
        return self._heap[0][2] if self._heap else None

    @property
    def queued(self) -> bool:
        """Whether the waiting heap holds entries (some may be stale)."""
        return bool(self._heap)

    def rebuild(self, waiting: Iterable[Request]) -> list[Request]:
        """Re-queue the still-waiting deferred requests among ``waiting`` (heapify, O(n));
        returns the others, in order: they are not deferred."""
        old, self._waiting, self._heap = self._waiting, set(), []
        rest: list[Request] = []
        for req in waiting:
            if req.request_id in old and not req.num_generated:
                self._waiting.add(req.request_id)
                self._heap.append((prompt_work(req), next(self._seq), req))
            else:
                rest.append(req)
        heapq.heapify(self._heap)
        return rest

    def split(self, prefills: list[Request]) -> tuple[list[Request], list[Request]]:
        """Forget finished or preempted requests; ``prefills`` as (on-time, deferred)."""
        if not self.running:
            return prefills, []
        running = RequestStatus.RUNNING
        self.running = {rid: r for rid, r in self.running.items() if r.status is running}
        return ([r for r in prefills if r.request_id not in self.running],
                [r for r in prefills if r.request_id in self.running])

    def yielding(self, view: InstanceView, cfg: SlackConfig, decodes: list[Request],
                 budgeted: list[Request], head: Request, limit: float
                 ) -> tuple[list[Request], list[Request]]:
        """The decodes that run with on-time prefill work, and the deferred ones that sit
        it out: a deferred decode runs only if its next token is due before the next
        iteration could give it, ``now`` + 2 x this iteration's predicted time (the on-time
        decodes and ``head``'s chunk at the budget). On AccelGen's mix an on-time prompt's
        TTFT SLO is 1-1.5x its prefill alone, so any work beside it can break it."""
        allowance = max(cfg.min_prefill_tokens, prefill_allowance(
            view, budgeted, limit, cfg.max_num_batched_tokens, head.num_computed))
        took = view.perf_model.predict(BatchShape(
            prefills=((min(allowance, prompt_work(head)), head.num_computed),),
            decodes=tuple(r.num_computed for r in budgeted)))
        horizon = view.now + 2 * took
        run, sit = list(budgeted), list[Request]()
        for r in decodes:
            if r.request_id in self.running:
                due = next_token_deadline(r)
                (run if due is not None and due < horizon else sit).append(r)
        return run, sit

    def narrow(self, view: InstanceView, cfg: SlackConfig, decodes: list[Request],
               head: Request, limit: float, start_by: float) -> float:
        """``limit`` narrowed to ``tbt_margin`` x the deferred decodes' smallest TBT slack
        (``late_bound``), unless at that budget ``head``, an on-time prompt, could no
        longer make its TTFT (``start_by``: its latest start): a TTFT that can still be
        met outranks a gap of a request that missed its own."""
        late = [r for r in decodes if r.request_id in self.running]
        narrow = min(limit, tbt_limit(view, late, cfg.tbt_margin))
        if narrow >= limit:
            return limit
        if self.holds(head.request_id) or head.ttft_deadline is None or head.num_generated:
            return narrow  # no on-time prompt at the head to lose its TTFT
        cap = cfg.max_num_batched_tokens
        allowance = max(cfg.min_prefill_tokens, prefill_allowance(
            view, decodes, narrow, cap, head.num_computed))
        dec = tuple(r.num_computed for r in decodes)
        if allowance >= cap or doomed(head, start_by, view, narrow, allowance, dec):
            return limit  # the narrower budget does not bind, or it costs a TTFT
        return narrow

    def admit(self, b: BatchBuilder, cfg: SlackConfig, prefills: list[Request]) -> None:
        """Fill what on-time work left of ``b``: the deferred prefills under way, then new
        deferred requests (shortest prompt first), ``late_chunk`` prompt tokens at most, all
        together, and at most ``late_max_running`` deferred requests at once."""
        left = cfg.late_chunk
        for req in prefills:
            if not b.removed(req) and (chunk := min(b.max_chunk(req), left)):
                b.add(req, chunk)
                left -= chunk
        while self._heap and len(self.running) < cfg.late_max_running and left:
            req = self._heap[0][2]
            if req.request_id not in self._waiting or req.status is not RequestStatus.WAITING:
                heapq.heappop(self._heap)
                self._waiting.discard(req.request_id)
                continue
            chunk = min(b.max_chunk(req), left)
            if chunk == 0 or not can_admit(b, req, chunk):
                break
            heapq.heappop(self._heap)
            self._waiting.discard(req.request_id)
            self.running[req.request_id] = req
            b.add(req, chunk)
            left -= chunk


def narrows(cfg: SlackConfig, limit: float) -> bool:
    """Whether ``late_bound`` lets the deferred decodes narrow a budget of ``limit``."""
    return cfg.late_bound == "always" or (cfg.late_bound == "idle" and limit == math.inf)
