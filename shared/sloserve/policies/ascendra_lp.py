"""Ascendra's low-priority (LP) instance (§5): throughput tier with proactive offloading.

Each iteration, Sarathi-style under ``token_budget`` and ``lp_max_num_seqs``
(the paper's LP batch size, 128):

1. §6.3 (``drop_late``): waiting requests already past their TTFT deadline
   are dropped.
2. §5.4: every running decode is piggybacked first (preempting by recompute
   when KV runs out), then ongoing chunked prefills continue.
3. §5.2, Algorithm 1: waiting requests are sorted by the value function
   (``value_function``: edf default, sjf, ljf, fcfs) and admitted in that
   order while budget, sequence slots and KV remain; the first that does not
   fit ends admission (Algorithm 1's ``break``). A request may get a chunk.
4. §5.3: every request still waiting is checked for offloading, in value
   order. Rule: offload ``r`` iff it has a TTFT SLO, has produced no token and
   its prefill has not started, its deadline ``d`` has not yet passed, and

   * it is projected to miss on this LP: ``now + t_iter * ceil(Q_r / P) > d``,
     where ``Q_r`` is the prefill tokens queued up to and including ``r``
     (ongoing prefills, this iteration's chunks, the requests kept ahead of
     it), ``P = token_budget - running decodes`` the prefill tokens per
     iteration and ``t_iter`` the predicted time of one such iteration with
     the current decodes piggybacked; and
   * it is too close to its SLO to stay (the tunable threshold):
     ``d - now <= offload_threshold * t_hp``, where ``t_hp`` is the
     worst-case HP batch holding its prefill: one prefill of
     ``max(hp_worst_batch_tokens, r's prompt)`` tokens (a single sequence
     bounds the attention cost of any batch with that many tokens).

   A request that has already missed its deadline is never offloaded (HP
   cannot save it; ``drop_late`` handles it), so ``offload_threshold = 0``
   disables offloading. The LP projection ignores context growth and KV or
   slot limits: it is a lower bound on the LP finish time.

Cost per iteration: one sort of the waiting queue plus O(waiting) arithmetic
and two ``predict`` calls (one more per waiting prompt longer than
``hp_worst_batch_tokens`` that is projected to miss).

Config (``AscendraConfig``) used: ``token_budget``, ``lp_max_num_seqs``,
``value_function``, ``offload_threshold``, ``hp_worst_batch_tokens``, ``drop_late``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.batch import BatchPlan, BatchShape
from sloserve.perf.base import PerfModel
from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.base import (
    BatchBuilder,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
)
from sloserve.policies.value_functions import get_value_function
from sloserve.request import Request


def awaits_first_token(req: Request) -> bool:
    """Not yet in prefill and no token out: its TTFT is still open (offload/drop candidate)."""
    return req.num_generated == 0 and not req.prefill_started


def late_requests(view: InstanceView) -> list[Request]:
    """§6.3: waiting requests already past their TTFT deadline that have not started."""
    out = []
    for req in view.waiting:
        deadline = req.ttft_deadline
        if deadline is not None and view.now > deadline and awaits_first_token(req):
            out.append(req)
    return out


def worst_hp_time(perf_model: PerfModel, num_tokens: int, hp_worst_batch_tokens: int) -> float:
    """§5.3: predicted time of the largest HP batch holding a ``num_tokens`` prefill."""
    n = max(num_tokens, hp_worst_batch_tokens)
    return perf_model.predict(BatchShape(prefills=((n, 0),)))


class AscendraLPPolicy(Policy):
    name = "ascendra-lp"
    config_cls = AscendraConfig
    config: AscendraConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.value_function = get_value_function(self.config.value_function)
        self.token_budget = self.config.budget

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        b = BatchBuilder(view, self.token_budget, cfg.lp_max_num_seqs)
        waiting: Sequence[Request] = view.waiting
        if cfg.drop_late:
            late = late_requests(view)
            for req in late:
                b.drop(req)
            if late:
                waiting = [r for r in view.waiting if not b.removed(r)]
        decodes = [r for r in view.running if r.is_decode]
        add_decodes(b, decodes)
        queued = 0  # prefill tokens ahead of the next waiting request
        for req in view.running:  # ongoing prefills, in admission order
            if req.in_prefill and not b.removed(req):
                queued += req.num_uncomputed
                chunk = b.max_chunk(req)
                if chunk:
                    b.add(req, chunk)
        now, value = view.now, self.value_function
        order = sorted(waiting, key=lambda r: value(r, now))
        admitted = 0
        for req in order:  # Algorithm 1
            chunk = b.max_chunk(req)
            if chunk == 0 or not can_admit(b, req, chunk):
                break
            b.add(req, chunk)
            queued += req.num_uncomputed
            admitted += 1
        if admitted < len(order) and cfg.offload_threshold > 0:
            live = [r for r in decodes if b.contains(r)]
            self._flag_offloads(b, order[admitted:], queued, live)
        return b.build()

    def _flag_offloads(
        self, b: BatchBuilder, rest: Sequence[Request], queued: int, decodes: Sequence[Request]
    ) -> None:
        """§5.3: offload the requests projected to miss TTFT here and too close to stay."""
        cfg, view = self.config, b.view
        now, model = view.now, view.perf_model
        per_iter = max(self.token_budget - len(decodes), 1)
        t_iter = model.predict(
            BatchShape(prefills=((per_iter, 0),), decodes=tuple(r.num_computed for r in decodes))
        )
        t_hp_base = worst_hp_time(model, 0, cfg.hp_worst_batch_tokens)
        longest = max((r.num_uncomputed for r in rest), default=0)
        t_hp_longest = worst_hp_time(model, longest, cfg.hp_worst_batch_tokens)
        stay_bound = cfg.offload_threshold * t_hp_longest
        by_deadline = cfg.value_function == "edf"
        for req in rest:
            n = req.num_uncomputed
            queued += n
            deadline = req.ttft_deadline
            if deadline is None or deadline <= now or not awaits_first_token(req):
                continue
            if deadline - now > stay_bound:  # too far from its SLO to leave, whatever its size
                if by_deadline:
                    break  # EDF order: every later request has at least this much slack
                continue
            if now + t_iter * -(-queued // per_iter) <= deadline:
                continue  # projected to make it on this LP
            t_hp = (
                t_hp_base
                if n <= cfg.hp_worst_batch_tokens
                else worst_hp_time(model, n, cfg.hp_worst_batch_tokens)
            )
            if deadline - now <= cfg.offload_threshold * t_hp:
                b.offload(req)
                queued -= n
