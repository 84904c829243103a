"""AccelGen: heterogeneous-SLO scheduling (Shen & Sen; §4.2-§4.4, Algorithms 1-2).

Each iteration:
1. Token budget (§4.2, Eq. 6): ``S_b = S_pf · SLO_min / T_pf``, with ``S_pf`` the
   pivot forward size (measured on the perf model at the first iteration,
   ``accelgen_pivot``, unless ``token_budget`` sets it), ``T_pf`` its *predicted*
   time, and ``SLO_min`` the tightest TBT SLO among the running requests (the
   requests "in a batch"); clamped to [``min_token_budget``, ``max_token_budget``].
2. Every running decode gets its token (stall-free; the builder's budget is at
   least the number of decodes). When KV runs out the running request with the
   largest remaining time ``T_r`` is preempted (Algorithm 1 lines 2-4).
3. Urgent requests (``T_r <= T_max``, §4.3), ongoing prefills and waiting ones,
   in ascending ``T_r``; an urgent waiting request that finds no KV preempts
   running requests with the largest ``T_r`` (non-urgent, later than it) until it
   fits (Algorithm 1 lines 2-4); then the other ongoing prefills.
4. SelectRequests (Algorithm 2) over windows of the waiting queue with ``T_r``
   within ``T_r^1 + gamma``: nearest (compute, KV) demand to what is left; then
   the first request left is chunked to fill ``S_b`` (dynamic chunking, §4.2).
At most one long prompt (``prompt_len >= long_prompt_threshold``) is in prefill
at a time (ERA, §4.2). JCT SLOs become per-iteration waiting allowances (``slo``).

Config: ``AccelGenConfig`` (``token_budget`` as S_pf, ``min_token_budget``,
``max_token_budget``, ``long_prompt_threshold``, ``max_num_seqs``, ``gamma``,
``select_window``, ``preempt_for_urgent``, ``jct_preempt_max``, ``jct_preempt_prob``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sloserve.batch import BatchPlan, BatchShape
from sloserve.policies.accelgen_pivot import measure_pivot
from sloserve.policies.accelgen_select import Demand, Entry, RemainingTimeQueue, nearest_first
from sloserve.policies.base import (
    BatchBuilder,
    BudgetConfig,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes_evicting,
    can_admit,
    knob,
)
from sloserve.request import Request
from sloserve.slo import JctClock, JctSlack, jct_allowed_wait, remaining_time

WATERMARK = 0.01  # share of KV kept free when admitting (vLLM's, as in ``can_admit``)
LONG_PROMPT = 4096  # tokens: a "long prompt" (§1: "long prompts (containing >= 4K tokens)")


def dynamic_token_budget(s_pf: int, slo_min: float | None, t_pf: float, lo: int, hi: int) -> int:
    """Eq. 6, ``S_b = S_pf · SLO_min / T_pf``, clamped to ``[lo, hi]``; ``S_pf`` with no SLO."""
    if slo_min is None or t_pf <= 0:
        return max(lo, min(hi, s_pf))
    return max(lo, min(hi, int(s_pf * slo_min / t_pf)))


def pivot_batch(s_pf: int, decodes: Sequence[Request]) -> BatchShape:
    """An ``S_pf``-token batch as this iteration would run it: the running decodes
    (their context read by attention) plus one prefill chunk for the rest."""
    ctx = tuple(r.num_computed for r in decodes[:s_pf])
    rest = s_pf - len(ctx)
    return BatchShape(prefills=((rest, 0),) if rest > 0 else (), decodes=ctx)


@dataclass(frozen=True, slots=True)
class AccelGenConfig(BudgetConfig):
    """AccelGen's knobs (§4.2-§4.4, §6.1)."""

    token_budget: int | None = knob(
        None, "AccelGen: pivot forward size S_pf of Eq. 6 (default: measured on the perf "
        "model, the forward size where tokens/s nearly saturates, §3)", min=1)
    min_token_budget: int = knob(32, "floor of the dynamic token budget S_b (§4.2)", min=1)
    max_token_budget: int = knob(4096, "ceiling of the dynamic token budget S_b (§4.2)", min=1)
    long_prompt_threshold: int = knob(
        LONG_PROMPT, "prompts at least this long are long (§1: >= 4K): one at a time in "
        "prefill (ERA, §4.2)", min=1)
    gamma: float = knob(0.75, "SelectRequests window: remaining time within T_r^1 + gamma, s "
                        "(§4.4, §6.1)", min=0.0)
    select_window: int = knob(64, "waiting requests SelectRequests examines per iteration",
                              min=1)
    preempt_for_urgent: bool = knob(
        True, "an urgent request without KV preempts max-T_r running work (Alg. 1 lines 2-4)")
    jct_preempt_max: float = knob(0.0, "JCT slack: the P_max preemption allowance, s (§4.3)",
                                  min=0.0)
    jct_preempt_prob: float = knob(0.0, "JCT slack: the preemption probability P (§4.3)",
                                   min=0.0, max=1.0)

    def resolved(self, *, tbt_slo: float | None = None,
                 slo_mix: str | None = None) -> AccelGenConfig:
        """Unchanged: an unset ``token_budget`` is S_pf, measured by the policy (§3)."""
        return self

    def check(self) -> None:
        if self.min_token_budget > self.max_token_budget:
            raise ValueError(f"min_token_budget: must be <= max_token_budget "
                             f"({self.max_token_budget}), got {self.min_token_budget}")


class AccelGenPolicy(Policy):
    name = "accelgen"
    config_cls = AccelGenConfig
    config: AccelGenConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.gamma = cfg.gamma
        self.select_window = cfg.select_window
        self.preempt_max = cfg.jct_preempt_max
        self.preempt_prob = cfg.jct_preempt_prob
        self.s_pf = cfg.token_budget  # the pivot forward size S_pf; None: measured (§3)
        self.queue = RemainingTimeQueue()
        self.jct: dict[str, JctClock] = {}
        self.token_budget = cfg.budget  # S_b of the latest iteration (S_pf once measured)
        self.t_max = 0.0  # predicted time of a full S_b batch, latest iteration
        self._long_busy = False  # a long prompt is in prefill (ERA), this iteration
        self._popped: list[Entry] = []  # waiting entries taken from the queue, this iteration
        self._running: Sequence[Request] = ()  # the instance's running requests, this iteration
        self.num_urgent_preemptions = 0  # running requests preempted for urgent ones (Alg. 1)

    # --- per-request remaining time (§4.3) ------------------------------------
    def _is_long(self, req: Request) -> bool:
        return req.prompt_len >= self.config.long_prompt_threshold

    def _jct_clock(self, req: Request) -> JctClock | None:
        if req.slo.jct is None:
            return None
        clock = self.jct.get(req.request_id)
        if clock is None:
            args = (req.prompt_len, req.output_len, self.token_budget, self.t_max)
            per_iter = jct_allowed_wait(req.slo.jct, *args, self.preempt_max, self.preempt_prob)
            clock = self.jct[req.request_id] = JctClock(JctSlack(per_iter), req.arrival_time)
        return clock

    def _remaining(self, req: Request, now: float) -> float:
        """``T_r``: the tighter of the TTFT/TBT deadline and the JCT allowance."""
        t_r = remaining_time(req, now, self.t_max, self.token_budget)
        clock = self._jct_clock(req)
        return t_r if clock is None else min(t_r, clock.remaining_time(now))

    def on_arrival(self, req: Request, now: float) -> None:
        self.queue.announce(req)

    # --- one iteration (Algorithm 1) -------------------------------------------
    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg, now, q = self.config, view.now, self.queue
        if self.s_pf is None:  # §3: measure S_pf once, on what the scheduler may see
            self.s_pf = self.token_budget = measure_pivot(view.perf_model.predict)
        q.key_pending(lambda r: now + self._remaining(r, now))
        if len(q) != len(view.waiting):
            q.rebuild(view.waiting, lambda r: now + self._remaining(r, now))
        decodes = [r for r in view.running if r.is_decode]
        s_b = self._budget(view, decodes)
        b = BatchBuilder(view, max(s_b, len(decodes)), cfg.max_num_seqs)
        self._running = view.running
        self._add_decodes(b, view.running, decodes, now)
        prefills = [r for r in view.running if r.in_prefill and not b.removed(r)]
        self._long_busy = any(self._is_long(r) for r in prefills)
        self._popped = []
        self._admit_urgent(b, prefills, now)
        for req in prefills:  # chunking resumes where it stopped (§4.2)
            if not b.contains(req):
                self._add_prefill(b, req)
        self._select(b, now)  # Algorithm 1 lines 5-7
        return self._close(b, view, now)

    def _budget(self, view: InstanceView, decodes: list[Request]) -> int:
        """§4.2 Eq. 6: ``S_b = S_pf x SLO_min / T_pf``, SLO_min over the iteration SLOs (TBT)
        of the requests in the batch: the running ones (a TTFT spans all of a prompt's
        chunks, so it is no iteration bound). Sets ``token_budget`` and ``t_max``."""
        cfg, s_pf = self.config, self.s_pf
        assert s_pf is not None
        slos = [s for r in view.running if (s := r.slo.tbt) is not None]
        t_pf = view.perf_model.predict(pivot_batch(s_pf, decodes))
        s_b = dynamic_token_budget(
            s_pf, min(slos, default=None), t_pf, cfg.min_token_budget, cfg.max_token_budget
        )
        self.token_budget, self.t_max = s_b, t_pf * s_b / s_pf
        return s_b

    def _admit_urgent(self, b: BatchBuilder, prefills: list[Request], now: float) -> None:
        """Algorithm 1 line 1, U -> B: urgent ongoing and waiting requests, ascending T_r
        (a waiting one that finds no KV blocks the rest: it is the most urgent, §4.3)."""
        q = self.queue
        urgent = [(t_r, r) for r in prefills if (t_r := self._remaining(r, now)) <= self.t_max]
        urgent.sort(key=lambda x: x[0], reverse=True)
        while self._slot(b) and (e := q.peek()) and e.latest_start - now <= self.t_max:
            while urgent and urgent[-1][0] <= e.latest_start - now:
                self._add_prefill(b, urgent.pop()[1])
            if not self._slot(b) or self._pop() is None:
                break
            if self._long_busy and self._is_long(e.req):
                continue  # ERA: waits for the long prompt in prefill
            self._add_prefill(b, e.req)
            if not b.contains(e.req) and self._preempt_for(b, e.req, e.latest_start - now, now):
                self._add_prefill(b, e.req)
            if not b.contains(e.req):
                break
        for _, req in reversed(urgent):
            self._add_prefill(b, req)

    def _close(self, b: BatchBuilder, view: InstanceView, now: float) -> BatchPlan:
        """The plan; the popped requests left out go back to the queue, the preempted ones
        are announced again, and each batched JCT request's clock starts an iteration."""
        q = self.queue
        plan = b.build()
        batched = {i.request_id for i in plan.items}
        q.restore(e for e in self._popped if e.req.request_id not in batched)
        by_id = {r.request_id: r for r in view.running}
        for rid in plan.preempted:
            q.announce(by_id[rid])
        for rid in batched & self.jct.keys():
            self.jct[rid].start_iteration(now)
        return plan

    def _pop(self) -> Entry | None:
        """Take the next waiting request, at most ``select_window`` per iteration."""
        if len(self._popped) >= self.select_window or (e := self.queue.pop()) is None:
            return None
        self._popped.append(e)
        return e

    @staticmethod
    def _slot(b: BatchBuilder) -> bool:
        """Whether a new request could still join, KV aside: budget and a sequence slot."""
        return b.tokens_left > 0 and b.num_seqs < b.max_num_seqs

    def _preempt_for(self, b: BatchBuilder, req: Request, t_r: float, now: float) -> bool:
        """Algorithm 1 lines 2-4: free KV for urgent ``req`` by preempting running requests
        with the largest ``T_r`` — only non-urgent ones later than ``req``, and only if
        enough can be freed. Whether any were preempted."""
        kv = b.view.kv
        need = kv.blocks_for(req.num_tokens) + int(WATERMARK * kv.num_blocks)
        if not self.config.preempt_for_urgent or need > kv.num_blocks:
            return False
        bar = max(self.t_max, t_r)
        cands = sorted(
            ((t, r) for r in self._running
             if not b.removed(r) and (t := self._remaining(r, now)) > bar),
            key=lambda x: x[0], reverse=True)
        free, victims = b.free_blocks, []
        for _, r in cands:
            if free >= need:
                break
            free += kv.num_blocks_of(r.request_id) + b.scheduled_blocks(r)
            victims.append(r)
        if free < need or not victims:
            return False
        for r in victims:
            b.preempt_scheduled(r)
        self.num_urgent_preemptions += len(victims)
        return True

    @staticmethod
    def _room(b: BatchBuilder) -> bool:
        """Whether a new request could still join: budget, a slot and KV above the watermark."""
        reserve = int(WATERMARK * b.view.kv.num_blocks)
        return b.tokens_left > 0 and b.num_seqs < b.max_num_seqs and b.free_blocks > reserve

    def _add_decodes(
        self, b: BatchBuilder, running: Sequence[Request], decodes: list[Request], now: float
    ) -> None:
        """Every decode gets its token; on KV shortage preempt the max-``T_r`` running request
        (Algorithm 1 lines 2-4) instead of vLLM's most recently admitted one."""
        if b.add_decodes_if_all_fit(decodes):
            return
        victims = sorted(running, key=lambda r: self._remaining(r, now))
        add_decodes_evicting(b, [r for r in victims if r.is_decode], victims)

    def _chunk(self, b: BatchBuilder, req: Request) -> int:
        """Largest admissible chunk of ``req`` now (0 if none): ERA bars a second long
        prompt; a new request needs KV for its whole prompt (``can_admit``, as vLLM)."""
        chunk = b.max_chunk(req)
        if chunk == 0 or req.prefill_started:
            return chunk
        if self._long_busy and self._is_long(req):
            return 0
        return chunk if can_admit(b, req, chunk, WATERMARK) else 0

    def _add_prefill(self, b: BatchBuilder, req: Request, chunk: int | None = None) -> None:
        chunk = self._chunk(b, req) if chunk is None else chunk
        if chunk:
            b.add(req, chunk)
            self._long_busy = self._long_busy or self._is_long(req)

    def _select(self, b: BatchBuilder, now: float) -> None:
        """SelectRequests (Algorithm 2) over successive windows ``T_r <= T_r^1 + gamma``."""
        kv = b.view.kv
        bs, reserve = kv.block_size, int(WATERMARK * kv.num_blocks)
        while self._room(b) and (first := self._pop()) is not None:
            window = [first.req]
            limit = first.latest_start + self.gamma
            while (e := self.queue.peek()) and e.latest_start <= limit and (e := self._pop()):
                window.append(e.req)
            a_c, a_m = b.tokens_left, (b.free_blocks - reserve) * bs
            demands: list[Demand | None] = []
            for req in window:  # lines 4-6: a long prompt's chunk fills S_b (or KV)
                long_ = self._is_long(req)
                n = self._chunk(b, req) if long_ else req.num_uncomputed
                ok = n > 0 and kv.blocks_for(req.num_tokens) * bs <= a_m
                demands.append(Demand(n, b.blocks_needed(req, n) * bs, long_) if ok else None)
            for k in nearest_first(demands, a_c, a_m, b.max_num_seqs - b.num_seqs):
                d = demands[k]
                assert d is not None
                self._add_prefill(b, window[k], d.compute)
            for req, d in zip(window, demands, strict=True):  # §4.2: fill S_b in order
                if not self._room(b):
                    break
                if d is not None and not b.contains(req):
                    self._add_prefill(b, req)

    def on_batch_end(self, view: InstanceView, plan: BatchPlan) -> None:
        if not self.jct:
            return
        alive = {r.request_id for r in view.running}
        for item in plan.items:
            clock = self.jct.get(item.request_id)
            if clock is None:
                continue
            if item.request_id in alive:
                clock.end_iteration(view.now)
            else:
                del self.jct[item.request_id]
