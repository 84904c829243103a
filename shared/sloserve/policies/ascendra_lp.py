"""Ascendra's low-priority (LP) instance (§5): throughput tier with proactive offloading.

Each iteration:

1. §6.3 (``drop_late``): waiting requests already past their TTFT deadline
   are dropped.
2. §5.4: every running decode is piggybacked first (preempting by recompute
   when KV runs out), then ongoing prefills continue (a prefill is only ever
   in progress when it was longer than the budgets allowed whole, below).
3. §5.2, Algorithm 1: waiting requests are taken in value order (``value_function``:
   ``edf`` default, ``priority``, ``sjf``, ``ljf``, ``fcfs``; ``val <- pi(Phi, w)``)
   and each is admitted **whole** while the three budgets hold:

   * N, the token budget (``token_budget``, default ``hp_worst_batch_tokens``):
     its whole remaining prefill must fit the tokens the batch has left;
   * C, the compute budget (``compute_budget``, default the tightest TBT SLO
     among the batch's piggybacked decodes): the regression's predicted time
     of the batch with it must stay within C (no decodes: no C);
   * M, memory: free KV (vLLM's admission check), and ``lp_max_num_seqs``
     (§6.2: 128) sequences.

   The first request that does not fit ends admission (Algorithm 1's
   ``break``). One exception keeps a request from blocking the queue forever:
   if the head of the value order does not fit whole and no other prefill is
   in the batch, it gets the largest chunk that fits N, C and M (a prompt
   longer than N could otherwise never run).
4. §5.3: every request still waiting is checked for offloading, in value
   order. Offload ``r`` iff it has a TTFT SLO, has produced no token and has
   not started prefill, its deadline ``d`` is still ahead, and

   * it is projected to miss on this LP: ``now + t_iter * ceil(Q_r / P) > d``,
     ``Q_r`` the prefill tokens queued up to and including ``r``, ``P = N -
     running decodes`` prefill tokens per iteration, ``t_iter`` the predicted
     time of one such iteration with the current decodes; and
   * it is too close to its SLO to stay: ``d - now <= offload_threshold *
     (t_hp_worst + Phi(r))``: after an offload it waits on the HP for at most
     the batch the HP is running, whose worst case is a prefill of
     ``hp_worst_batch_tokens`` tokens, and then runs its own prefill.

Cost per iteration: no sort. The waiting queue is a heap keyed by the value
function (``ascendra_queue``); admission and the offload scan pop it in order
(for EDF the scan stops at the first request with too much slack to be
offloaded); one ``predict`` per admitted prefill when C applies, a dozen for
a chunked head, three for the offload rule.

Config (``AscendraConfig``) used: ``token_budget``, ``compute_budget``,
``lp_max_num_seqs``, ``value_function``, ``offload_threshold``,
``hp_worst_batch_tokens``, ``drop_late``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sloserve.batch import BatchPlan, BatchShape
from sloserve.perf.base import PerfModel
from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.ascendra_queue import Entry, ValueQueue
from sloserve.policies.base import (
    BatchBuilder,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
)
from sloserve.policies.value_functions import SLACK_ORDERED, get_value_function
from sloserve.request import Request


def awaits_first_token(req: Request) -> bool:
    """Not yet in prefill and no token out: its TTFT is still open (offload/drop candidate)."""
    return req.num_generated == 0 and not req.prefill_started


def late_requests(view: InstanceView) -> list[Request]:
    """§6.3: waiting requests already past their TTFT deadline that have not started (only
    a TTFT the request asked for: a deployment's default never drops it, issue 35)."""
    out = []
    for req in view.waiting:
        deadline = req.ttft_deadline
        if (deadline is not None and view.now > deadline and awaits_first_token(req)
                and req.slo.own("ttft") is not None):
            out.append(req)
    return out


def worst_hp_time(perf_model: PerfModel, hp_worst_batch_tokens: int) -> float:
    """§5.3: predicted time of the largest HP batch (``hp_worst_batch_tokens`` of prefill)."""
    return perf_model.predict(BatchShape(prefills=((hp_worst_batch_tokens, 0),)))


class ComputeBudget:
    """Algorithm 1's C: the batch's predicted time with a candidate must stay within it."""

    def __init__(self, model: PerfModel, limit: float, decodes: Sequence[Request]) -> None:
        self.model = model
        self.limit = limit
        self.decodes = tuple(r.num_computed for r in decodes)
        self.prefills: list[tuple[int, int]] = []

    def allows(self, req: Request, n: int) -> bool:
        if math.isinf(self.limit):
            return True
        shape = BatchShape(prefills=(*self.prefills, (n, req.num_computed)), decodes=self.decodes)
        return self.model.predict(shape) <= self.limit

    def largest(self, req: Request, hi: int) -> int:
        """Largest chunk ``<= hi`` of ``req`` within C (binary search on the regression)."""
        if hi <= 0 or self.allows(req, hi):
            return max(hi, 0)
        lo = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.allows(req, mid):
                lo = mid
            else:
                hi = mid
        return lo

    def add(self, req: Request, n: int) -> None:
        self.prefills.append((n, req.num_computed))


class AscendraLPPolicy(Policy):
    name = "ascendra-lp"
    config_cls = AscendraConfig
    config: AscendraConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.value_function = get_value_function(self.config.value_function)
        self.token_budget = self.config.budget
        self.queue = ValueQueue(self.value_function)

    def on_arrival(self, req: Request, now: float) -> None:
        self.queue.join(req)

    def on_requeued(self, reqs: Sequence[Request]) -> None:
        self.queue.join_front(reqs)

    def compute_limit(self, decodes: Sequence[Request]) -> float:
        """C: the configured budget, else the tightest TBT SLO of the piggybacked decodes."""
        if self.config.compute_budget is not None:
            return self.config.compute_budget
        return min((r.slo.tbt for r in decodes if r.slo.tbt is not None), default=math.inf)

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        b = BatchBuilder(view, self.token_budget, cfg.lp_max_num_seqs)
        if cfg.drop_late:
            for req in late_requests(view):
                b.drop(req)
        add_decodes(b, [r for r in view.running if r.is_decode])
        decodes = [r for r in view.running if r.is_decode and b.contains(r)]
        budget = ComputeBudget(view.perf_model, self.compute_limit(decodes), decodes)
        queued = 0  # prefill tokens ahead of the next waiting request
        for req in view.running:  # ongoing prefills, in admission order
            if req.in_prefill and not b.removed(req):
                queued += req.num_uncomputed
                chunk = budget.largest(req, b.max_chunk(req))
                if chunk:
                    b.add(req, chunk)
                    budget.add(req, chunk)
        self.queue.sync(view.waiting, view.perf_model)
        kept: list[Entry] = []
        while (e := self.queue.pop()) is not None:  # Algorithm 1, in value order
            req = e[2]
            if b.removed(req):  # dropped late above
                self.queue.discard(req)
                continue
            n = req.num_uncomputed
            chunk = n if b.fits(req, n) and budget.allows(req, n) else 0
            if chunk == 0 and not budget.prefills:  # the head may run chunked (see above)
                chunk = budget.largest(req, b.max_chunk(req))
            if chunk == 0 or not can_admit(b, req, chunk):
                kept.append(e)
                break
            b.add(req, chunk)
            budget.add(req, chunk)
            self.queue.discard(req)
            queued += n
        if kept and cfg.offload_threshold > 0:
            self._flag_offloads(b, kept, queued, decodes)
        self.queue.push_back(kept)
        plan = b.build()
        if plan.preempted:  # back to the waiting queue's front in arrival order (Instance)
            gone = set(plan.preempted)
            back = [r for r in view.running if r.request_id in gone]
            self.queue.join_front(sorted(back, key=lambda r: r.arrival_time))
        return plan

    def _flag_offloads(
        self, b: BatchBuilder, kept: list[Entry], queued: int, decodes: Sequence[Request]
    ) -> None:
        """§5.3: offload the requests projected to miss TTFT here and too close to stay.

        Scans the queue in value order from ``kept[0]`` (the request that ended
        admission); every request looked at is appended to ``kept`` unless offloaded.
        """
        cfg, view = self.config, b.view
        now, model = view.now, view.perf_model
        per_iter = max(self.token_budget - len(decodes), 1)
        t_iter = model.predict(
            BatchShape(prefills=((per_iter, 0),), decodes=tuple(r.num_computed for r in decodes))
        )
        theta = cfg.offload_threshold
        t_worst = worst_hp_time(model, cfg.hp_worst_batch_tokens)
        # EDF pops by latest start s = d - Phi; offload needs d - now <= theta (t_worst + Phi),
        # i.e. s - now <= theta t_worst + (theta - 1) Phi: past this bound no later one can
        stop = (
            theta * t_worst + max(theta - 1.0, 0.0) * self.queue.max_prefill_time()
            if cfg.value_function in SLACK_ORDERED else math.inf
        )
        e: Entry | None = kept.pop()
        while e is not None:
            (first_key, *_), _, req, phi = e
            if b.removed(req):
                self.queue.discard(req)
                e = self.queue.pop()
                continue
            n = req.num_uncomputed
            queued += n
            deadline = req.ttft_deadline
            kept.append(e)
            if first_key - now > stop:
                break  # EDF: every later request has at least this much slack
            if (
                deadline is not None
                and now < deadline
                and awaits_first_token(req)
                and deadline - now <= theta * (t_worst + phi)
                and now + t_iter * -(-queued // per_iter) > deadline
            ):
                kept.pop()
                b.offload(req)
                self.queue.discard(req)
                queued -= n
            e = self.queue.pop()
