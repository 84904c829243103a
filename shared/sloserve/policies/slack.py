"""``slack``: one policy from what the seed papers each use alone (docs/beyond.md, "Our policy").

Each iteration, for one instance:

1. **Stall-free decodes** (Sarathi-Serve §4.2): every running decode gets its
   next token; KV exhaustion preempts by recompute as vLLM does (``add_decodes``).
2. **Budget from the tightest TBT slack** (AccelGen §4.2 Eq. 6's idea, the
   per-iteration budget that fits the tightest request, Ascendra §3.3's slack
   from the perf model): a decode's slack is its next-token deadline (last
   token + its TBT SLO) minus now. The prefill tokens allowed are the most
   ``N`` whose batch — the decodes plus one prefill chunk of ``N`` — the perf
   model predicts to take at most ``tbt_margin`` x the smallest slack. With no
   decode holding a TBT SLO the budget is ``max_num_batched_tokens`` and whole
   prompts go in at once, as vLLM's prefill-first schedule does; the budget
   never falls below ``min_prefill_tokens`` so a prompt always progresses.
3. **Prefills by TTFT slack** (Ascendra §3.3 / EDF on the latest start time):
   ongoing prefills first, then waiting requests from a heap keyed by
   ``latest_start = deadline - predicted prefill time of the whole remaining
   prompt``; a longer prompt has less slack, so the order is prompt-length
   aware. The heap is kept across iterations (no per-iteration sort); it is
   rebuilt only when the waiting queue changed behind the policy's back
   (preemption, cancellation, offload).
4. **Early shedding** (Ascendra §6.3, ``shed``): a waiting request that has
   produced no token and whose latest start has passed can no longer meet its
   TTFT even alone on the GPU; it is dropped with a reason instead of taking
   GPU time from requests that still can. Beyond that, Moore-Hodgson's rule for
   the fewest late jobs on one machine (Moore, Mgmt. Sci. 1968) runs over the
   first ``shed_window`` queued requests in latest-start order: summing predicted
   prefill times at the current budget, whenever one would end past its TTFT the
   longest prompt so far is shed — goodput counts requests, so under a burst one
   long prompt goes instead of several short ones. A request keeps its KV once
   admitted.

Prefix caching: the prompt work a request still needs is read through
``prompt_work`` (its uncomputed tokens today); a prefix-cache-aware KV manager
plugs in there (not done).

Config: ``SlackConfig``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from sloserve.batch import BatchPlan, BatchShape
from sloserve.policies.base import (
    BatchBuilder,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
    knob,
)
from sloserve.request import Request, RequestStatus
from sloserve.slo import next_token_deadline

SHED_REASON = "slack: cannot meet its TTFT SLO any more (predicted prefill ends past the deadline)"
LATE_REASON = "slack: shed so that more queued requests meet their TTFT (Moore-Hodgson)"


@dataclass(frozen=True, slots=True)
class SlackConfig(PolicyConfig):
    """The slack policy's knobs."""

    max_num_batched_tokens: int = knob(
        8192, "slack: tokens per iteration when no decode is tight (vLLM's cap)", min=1)
    tbt_margin: float = knob(
        0.8, "slack: share of the tightest TBT slack one iteration may take (perf-model error)",
        min=0.05, max=1.0)
    min_prefill_tokens: int = knob(
        32, "slack: prefill tokens an iteration may always take, so prompts never starve", min=0)
    shed: bool = knob(True, "slack: drop waiting requests that can no longer meet their TTFT")
    shed_window: int = knob(
        64, "slack: queued requests (by latest start) the Moore-Hodgson shedding looks at "
        "(0: only shed requests that cannot make it alone)", min=0)


def prompt_work(req: Request) -> int:
    """Tokens ``req`` still has to prefill (hook: a prefix cache would subtract its hits)."""
    return req.num_uncomputed


def tbt_limit(view: InstanceView, decodes: list[Request], margin: float) -> float:
    """Seconds the next iteration may take: ``margin`` x the smallest decode TBT slack
    (``inf`` when no decode has a TBT SLO)."""
    slack = math.inf
    for r in decodes:
        deadline = next_token_deadline(r)
        if deadline is not None and deadline - view.now < slack:
            slack = deadline - view.now
    return slack * margin


def prefill_allowance(view: InstanceView, decodes: list[Request], limit: float,
                      cap: int, ctx: int) -> int:
    """The most prefill tokens ``N <= cap`` with predict(decodes + chunk N over ``ctx``)
    <= ``limit`` (binary search; the prediction grows with N)."""
    if limit == math.inf:
        return cap
    dec = tuple(r.num_computed for r in decodes)
    predict = view.perf_model.predict
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(BatchShape(prefills=((mid, ctx),), decodes=dec)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SlackPolicy(Policy):
    name = "slack"
    config_cls = SlackConfig
    config: SlackConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self._heap: list[tuple[float, int, Request]] = []
        self._queued: dict[str, float] = {}  # request id -> its key in the heap
        self._pending: list[Request] = []
        self._seq = itertools.count()

    def on_arrival(self, req: Request, now: float) -> None:
        self._pending.append(req)

    def latest_start(self, req: Request, view: InstanceView) -> float:
        """Deadline of its next token less the predicted time of its remaining prefill
        alone on the GPU (``inf`` with no deadline)."""
        deadline = next_token_deadline(req)
        if deadline is None:
            return math.inf
        shape = BatchShape(prefills=((prompt_work(req), req.num_computed),))
        return deadline - view.perf_model.predict(shape)

    @staticmethod
    def doomed(req: Request, key: float, view: InstanceView, limit: float, allowance: int,
               dec: tuple[int, ...]) -> bool:
        """Whether ``req`` can no longer meet its TTFT: its latest start has passed, or its
        prompt needs more iterations of this budget than it has time left — the last one
        as predicted beside the decodes ``dec``, each earlier one up to ``limit`` s."""
        if key < view.now:
            return True
        deadline = req.ttft_deadline
        if deadline is None or limit == math.inf or allowance < 1:
            return False
        work = prompt_work(req)
        last = view.perf_model.predict(
            BatchShape(prefills=((min(work, allowance), req.num_computed),), decodes=dec))
        return view.now + (math.ceil(work / allowance) - 1) * limit + last > deadline

    def overflow(self, view: InstanceView, ongoing: int, limit: float,
                 allowance: int) -> list[Request]:
        """Moore-Hodgson (minimum number of late jobs on one machine) over the first
        ``shed_window`` queued requests in latest-start order: walk them, summing
        predicted prefill times from now (after ``ongoing`` prompt tokens); whenever one
        would end past its TTFT deadline, shed the longest walked so far. Returns the shed."""
        window = [e for e in heapq.nsmallest(self.config.shed_window, self._heap)
                  if self._queued.get(e[2].request_id) == e[0]
                  and e[2].num_generated == 0 and e[2].ttft_deadline is not None]
        if not window:
            return []
        if limit == math.inf:
            def cost(tokens: int) -> float:
                return view.perf_model.predict(BatchShape(prefills=((tokens, 0),)))
        else:
            rate = limit / max(allowance, 1)  # seconds per prompt token at this budget

            def cost(tokens: int) -> float:
                return tokens * rate
        t = view.now + (cost(ongoing) if ongoing else 0.0)
        kept: list[tuple[float, int, Request]] = []  # max-heap on cost
        shed: list[Request] = []
        for _, seq, req in window:
            c = cost(prompt_work(req))
            heapq.heappush(kept, (-c, seq, req))
            t += c
            deadline = req.ttft_deadline
            assert deadline is not None
            if t > deadline:
                neg, _, longest = heapq.heappop(kept)
                t += neg
                shed.append(longest)
        return shed

    def _push(self, req: Request, view: InstanceView) -> None:
        key = self.latest_start(req, view)
        self._queued[req.request_id] = key
        heapq.heappush(self._heap, (key, next(self._seq), req))

    def _sync(self, view: InstanceView) -> None:
        """Push new arrivals; rebuild (heapify, O(n)) if the waiting queue changed otherwise."""
        for req in self._pending:
            if req.request_id not in self._queued and req.status is RequestStatus.WAITING:
                self._push(req, view)
        self._pending.clear()
        if len(self._queued) == len(view.waiting):
            return
        keys = self._queued
        self._queued = {}
        self._heap = []
        for req in view.waiting:
            key = keys.get(req.request_id)
            if key is None or req.num_computed or req.num_generated:
                key = self.latest_start(req, view)
            self._queued[req.request_id] = key
            self._heap.append((key, next(self._seq), req))
        heapq.heapify(self._heap)

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        self._sync(view)
        decodes = [r for r in view.running if r.is_decode]
        prefills = sorted((r for r in view.running if r.in_prefill),
                          key=lambda r: self._queued.get(r.request_id, r.arrival_time))
        head = prefills[0] if prefills else (self._heap[0][2] if self._heap else None)
        cap = cfg.max_num_batched_tokens
        limit = tbt_limit(view, decodes, cfg.tbt_margin)
        allowance = 0
        if head is not None:
            allowance = max(cfg.min_prefill_tokens, prefill_allowance(
                view, decodes, limit, cap, head.num_computed))
        b = BatchBuilder(view, len(decodes) + allowance, cfg.max_num_seqs)
        add_decodes(b, decodes)
        for req in prefills:
            if not b.removed(req) and (chunk := b.max_chunk(req)):
                b.add(req, chunk)
        if cfg.shed and cfg.shed_window and self._heap:
            ongoing = sum(prompt_work(r) for r in prefills)
            for req in self.overflow(view, ongoing, limit, allowance):
                hopeless = self._queued.pop(req.request_id) < view.now
                b.drop(req, SHED_REASON if hopeless else LATE_REASON)
        held: list[tuple[float, int, Request]] = []
        dec = tuple(r.num_computed for r in decodes)
        while self._heap:
            entry = heapq.heappop(self._heap)
            key, _, req = entry
            if self._queued.get(req.request_id) != key or req.status is not RequestStatus.WAITING:
                continue  # stale: admitted, dropped or re-keyed since it was pushed
            fresh = req.num_generated == 0
            if cfg.shed and fresh and self.doomed(req, key, view, limit, allowance, dec):
                del self._queued[req.request_id]
                b.drop(req, SHED_REASON)
                continue
            chunk = b.max_chunk(req)
            if chunk == 0 or not can_admit(b, req, chunk):
                held.append(entry)
                break
            del self._queued[req.request_id]
            b.add(req, chunk)
        for entry in held:
            heapq.heappush(self._heap, entry)
        return b.build()
