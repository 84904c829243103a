"""``slack``: one policy from what the seed papers each use alone (docs/beyond.md, "Our policy").

Each iteration, for one instance:

1. **Stall-free decodes** (Sarathi-Serve §4.2): every running decode gets its
   next token; KV exhaustion preempts by recompute as vLLM does (``add_decodes``).
2. **Budget from the tightest TBT slack** (AccelGen §4.2 Eq. 6's idea, the
   per-iteration budget that fits the tightest request, Ascendra §3.3's slack
   from the perf model): a decode's slack is its next-token deadline (last
   token + its TBT SLO) minus now. The prefill tokens allowed are the most
   ``N`` whose batch — the decodes plus one prefill chunk of ``N`` — the perf
   model predicts to take at most ``tbt_margin`` x the smallest slack. On-time
   decodes set it. When none does, the deferred ones (4, below) do, unless at
   that budget the first on-time prompt could no longer make its TTFT
   (``late_bound``): a deferred request has missed its TTFT, but its gaps count
   in the pooled P99 TBT (Sarathi-Serve §5.1), and a whole 6,000-token prompt
   would stretch them to 0.5-0.75 s. With no
   decode holding a TBT SLO the budget is ``max_num_batched_tokens`` and whole
   prompts go in at once, as vLLM's prefill-first schedule does; the budget
   never falls below ``min_prefill_tokens`` so a prompt always progresses.
   **Whole tiles** (``tile``, Sarathi-Serve §4.3's tile quantization): a
   TBT-bounded iteration is cut to the last multiple of 128 tokens, since a GEMM
   one token past a tile costs a tile more; the plans of 3 then price an
   iteration of this budget at its predicted time, not at the limit.
   **A stall that saves a request** (``stall_share``): when the first queued
   prompt would miss its TTFT in chunks of this budget but makes it whole, it goes
   in whole if every on-time decode's *mean* TBT (what goodput judges) still meets
   its SLO after that one long iteration and the decode gaps stalls stretched past
   their SLO stay within ``stall_share`` of all gaps (the pooled P99 TBT criterion,
   Sarathi-Serve §5.1, allows 1 %): vLLM's prefill-first stall, taken only where it
   saves a request.
3. **Which prompts, in which order** — "prioritise shorter requests for
   throughput while ensuring longer ones are processed in time" (Ascendra §2,
   Fig. 2; its §5.2/§8.4 EDF-vs-SJF ablation), made exact on the one-machine
   model of prefill (each prompt a job of its predicted prefill time at this
   budget, due at its TTFT deadline):

   a. waiting requests sit in a heap keyed by their next-token deadline (EDF,
      Ascendra §3.3 / §5.2; the TTFT deadline for a fresh request). The heap
      is kept across iterations and rebuilt (heapify) only when the waiting
      queue changed behind the policy's back (preemption, cancellation, offload);
   b. a request whose *latest start* (deadline - predicted prefill alone) has
      passed, or whose prompt needs more iterations of this budget than its
      TTFT leaves, can no longer make it (``doomed``);
   c. **the most on time** — Moore-Hodgson (Moore, Mgmt. Sci. 1968; optimal for
      the fewest late jobs on one machine) over the first ``shed_window``
      requests in deadline order: whenever the running sum of prefill times
      passes a deadline, the longest prompt so far is given up. Goodput counts
      requests, so under a burst one long prompt goes instead of several short ones;
   d. **short first among those with slack** — the kept set is admitted in the
      order of Smith's backward rule (Smith, Nav. Res. Log. Q. 1956; optimal for
      the least total completion time subject to every deadline): from the end,
      the longest prompt whose deadline allows it to end last goes last. So a
      short prompt goes ahead of a long one whenever the long one still meets
      its deadline after it, and an urgent long one goes first. This is what
      lowers the median scheduling delay (the ``tail`` criterion) and mean TTFT
      against plain EDF or the previous latest-start order (docs/beyond.md),
      without losing a request that EDF would have kept. Smith's rule plans a
      long prompt to end just at its deadline, so any optimism of the prediction
      makes it late: a prompt may go last only if it would still end in time
      with the predicted work ahead of it doubled (``smith_margin`` 1.0);
   e. ongoing prefills continue first; a preempted request (already has tokens)
      goes before the fresh ones in the window.
4. **Requests given up** (``late``). ``triage`` (default): a request that
   the load made late — Moore-Hodgson gave it up for others, or its latest
   start passed while other on-time requests wait — is *dropped* with a
   reason, Ascendra §6.3's drop under overload: serving it late would take GPU
   time from requests that can still make it. One that never could make its
   TTFT (its prefill alone is predicted to outlast its TTFT SLO, as for about
   half of AccelGen's heterogeneous mix), or that missed only by waiting for
   the running iteration with nobody else queued, is *deferred*. Deferred
   requests wait in a background queue, shortest remaining prompt first
   (SPT: the least mean wait among them), and are admitted only when no
   on-time request is held back, with the budget on-time work leaves,
   ``late_chunk`` prompt tokens per iteration for all of them together, and at
   most ``late_max_running`` at once: at low load they are served at once,
   under overload they cannot crowd out on-time work. A deferred decode sits
   out an iteration that carries on-time prefill work unless its next token is
   due before the next iteration could give it (``late_yield``): on AccelGen's
   mix an on-time prompt's TTFT SLO is 1-1.5x its prefill alone, so any work
   beside it can break it. ``defer`` defers every given-up request (nothing refused;
   ~2 points less goodput share near capacity on ShareGPT, docs/beyond.md),
   ``drop`` drops every one (refuses even requests an idle GPU could serve
   late), ``serve`` gives up nothing (3b, 3c off).
   A request keeps its KV once admitted. Deferred decodes set the TBT budget (2)
   only where no on-time decode does and no on-time prompt loses its TTFT by it
   (``late_bound``); with ``late_in_budget`` they always set it, at half the
   goodput under overload.

Prefix caching: the prompt work a request still needs is read through
``prompt_work`` (its uncomputed tokens today; the instance's prefix lookup
already counts cached tokens as computed).

Config: ``SlackConfig``.
"""

from __future__ import annotations

import heapq
import itertools
import math

from sloserve.batch import BatchPlan, BatchShape
from sloserve.policies.base import (
    BatchBuilder,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
)
from sloserve.policies.slack_config import SlackConfig
from sloserve.policies.slack_lane import BackgroundLane, narrows
from sloserve.policies.slack_rules import (
    doomed,
    moore_hodgson,
    prefill_allowance,
    prefill_cost,
    prompt_work,
    smith_order,
    tbt_limit,
    tile_aligned,
)
from sloserve.request import Request, RequestStatus
from sloserve.slo import next_token_deadline

__all__ = ["LATE_REASON", "SHED_REASON", "SlackConfig", "SlackPolicy"]

SHED_REASON = "slack: cannot meet its TTFT SLO any more (predicted prefill ends past the deadline)"
LATE_REASON = "slack: shed so that more queued requests meet their TTFT (Moore-Hodgson)"
class SlackPolicy(Policy):
    name = "slack"
    config_cls = SlackConfig
    config: SlackConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self._heap: list[tuple[float, int, Request]] = []
        self._queued: dict[str, float] = {}  # request id -> its key in the heap
        self._start_by: dict[str, float] = {}  # request id -> latest start (while queued)
        self._lane = BackgroundLane()  # the deferred requests
        self._pending: list[Request] = []
        self._seq = itertools.count()
        self._gaps = 0  # decode tokens planned on this instance (the gaps they close)
        self._stretched = 0  # of them, planned in a stall past their own TBT SLO

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

    def _key(self, req: Request, start_by: float) -> float:
        if self.config.order == "latest-start":
            return start_by
        deadline = next_token_deadline(req)
        return math.inf if deadline is None else deadline

    def _push(self, req: Request, view: InstanceView) -> None:
        start_by = self.latest_start(req, view)
        key = self._key(req, start_by)
        rid = req.request_id
        self._queued[rid] = key
        self._start_by[rid] = start_by
        heapq.heappush(self._heap, (key, next(self._seq), req))

    def _unqueue(self, req: Request) -> None:
        del self._queued[req.request_id]
        del self._start_by[req.request_id]

    def _give_up(self, b: BatchBuilder, req: Request, hopeless: bool) -> None:
        """``req`` cannot (``hopeless``) or, by Moore-Hodgson, should not meet its TTFT: defer
        or drop it. ``triage`` drops it only if the load made it late — Moore-Hodgson gave it
        up for others, or it is hopeless while other on-time requests wait — and defers it
        otherwise: it never could (its prefill alone is predicted to outlast its TTFT SLO),
        or it missed by waiting for a running iteration with nobody else in the queue."""
        contended = not hopeless or len(self._queued) > 1
        never = self._start_by[req.request_id] < req.arrival_time
        self._unqueue(req)
        mode = self.config.late
        if mode == "defer" or (mode == "triage" and (never or not contended)):
            self._lane.defer(req)
        else:
            b.drop(req, SHED_REASON if hopeless else LATE_REASON)

    def _sync(self, view: InstanceView) -> None:
        """Push new arrivals; rebuild (heapify, O(n)) if the waiting queue changed otherwise."""
        for req in self._pending:
            if req.request_id not in self._queued and req.status is RequestStatus.WAITING:
                self._push(req, view)
        self._pending.clear()
        if len(self._queued) + self._lane.num_waiting == len(view.waiting):
            return
        keys, starts = self._queued, self._start_by
        self._queued, self._start_by, self._heap = {}, {}, []
        for req in self._lane.rebuild(view.waiting):
            rid = req.request_id
            key, start_by = keys.get(rid), starts.get(rid)
            if key is None or start_by is None or req.num_computed or req.num_generated:
                start_by = self.latest_start(req, view)
                key = self._key(req, start_by)
            self._queued[rid] = key
            self._start_by[rid] = start_by
            self._heap.append((key, next(self._seq), req))
        heapq.heapify(self._heap)

    def _window(self, b: BatchBuilder, view: InstanceView, ongoing: int, step: float,
                allowance: int) -> list[Request]:
        """The first ``shed_window`` queued requests, in the order to admit them: requests
        that already have tokens first, then the fresh ones Moore-Hodgson keeps (the rest,
        and those past their latest start, given up unless ``late='serve'``), in Smith's
        order or the key order."""
        cfg = self.config
        give_up = cfg.late != "serve"
        first: list[Request] = []
        fresh: list[Request] = []
        for key, _, req in heapq.nsmallest(cfg.shed_window, self._heap):
            rid = req.request_id
            if self._queued.get(rid) != key or req.status is not RequestStatus.WAITING:
                continue  # stale
            if req.num_generated or req.ttft_deadline is None:
                first.append(req)
            elif give_up and self._start_by[rid] < view.now:
                self._give_up(b, req, hopeless=True)
            else:
                fresh.append(req)
        if not fresh:
            return first
        cost = prefill_cost(view, step, allowance)
        start = view.now + (cost(ongoing) if ongoing else 0.0)
        jobs = [(d, cost(prompt_work(r)), r) for r in fresh if (d := r.ttft_deadline) is not None]
        if cfg.order == "smith":
            jobs.sort(key=lambda j: j[0])  # stable: equal deadlines keep the heap order
        if give_up:
            jobs, late = moore_hodgson(jobs, start)
            for req in late:
                self._give_up(b, req, hopeless=self._start_by[req.request_id] < view.now)
        if cfg.order == "smith":
            return first + smith_order(jobs, start, cfg.smith_margin)
        return first + [j[2] for j in jobs]

    def _stall(self, view: InstanceView, decodes: list[Request], budgeted: list[Request],
               head: Request, limit: float, allowance: int) -> tuple[float, int]:
        """``(limit, allowance)`` for this iteration: as given, or widened to ``head``'s
        whole prompt when chunks of ``allowance`` would miss its TTFT deadline, the whole
        prompt beside ``decodes`` is predicted to make it, after that iteration every
        on-time decode's *mean* TBT (first token to its next, over the gaps) is still within
        ``tbt_margin`` of its SLO, and the gaps it stretches past their own TBT SLO keep
        the instance's stretched gaps within ``stall_share`` of all its planned gaps (they
        count once granted). Goodput judges the mean (docs/design.md), so a decode that
        banked time can absorb a stall, as vLLM's prefill-first schedule makes it do; the
        TBT-slack budget (rule 2 of the module docstring) guards every other gap."""
        work, deadline = prompt_work(head), head.ttft_deadline
        if (deadline is None or head.num_generated or work <= allowance
                or work > self.config.max_num_batched_tokens
                or self._queued.get(head.request_id) is None):
            return limit, allowance
        dec = tuple(r.num_computed for r in decodes)
        if not doomed(head, self._start_by[head.request_id], view, limit, allowance, dec):
            return limit, allowance  # its chunks make it: no stall needed
        took = view.perf_model.predict(BatchShape(prefills=((work, head.num_computed),),
                                                  decodes=dec))
        now = view.now
        if now + took > deadline:
            return limit, allowance  # hopeless even whole
        margin = self.config.tbt_margin
        for r in budgeted:
            tbt, tt = r.slo.tbt, r.token_times
            if tbt is not None and tt and took > margin * (tt[0] + len(tt) * tbt - now):
                return limit, allowance
        stretched = sum(1 for r in decodes if r.slo.tbt is not None and r.token_times
                        and now + took - r.token_times[-1] > r.slo.tbt)
        if self._stretched + stretched > self.config.stall_share * (self._gaps + len(decodes)):
            return limit, allowance
        self._stretched += stretched
        return max(limit, took), work

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        self._sync(view)
        decodes = [r for r in view.running if r.is_decode]
        lane = self._lane
        prefills, late_prefills = lane.split([r for r in view.running if r.in_prefill])
        head = (prefills[0] if prefills else self._heap[0][2] if self._heap
                else late_prefills[0] if late_prefills else lane.first_waiting)
        cap = cfg.max_num_batched_tokens
        # the budget protects the TBT of on-time requests; a deferred one has missed its SLO
        # (unless late_in_budget: it missed its TTFT, not its TBT)
        budgeted = decodes
        if lane.running and not cfg.late_in_budget:
            budgeted = [r for r in decodes if r.request_id not in lane.running]
        limit = tbt_limit(view, budgeted, cfg.tbt_margin)
        if head is not None and len(budgeted) < len(decodes) and narrows(cfg, limit):
            limit = lane.narrow(view, cfg, decodes, head, limit,
                                self.latest_start(head, view))
        sitting: list[Request] = []
        if cfg.late_yield and head is not None and len(budgeted) < len(decodes) and (
                prefills or self._heap):
            decodes, sitting = lane.yielding(view, cfg, decodes, budgeted, head, limit)
        allowance, step = 0, limit
        if head is not None:
            allowance = max(cfg.min_prefill_tokens, prefill_allowance(
                view, decodes, limit, cap, head.num_computed))
            if limit != math.inf:  # a TBT-bounded iteration: whole tiles
                allowance = tile_aligned(allowance, len(decodes), cfg.tile)
                if cfg.stall_share and not prefills:
                    limit, allowance = self._stall(
                        view, decodes, budgeted, head, limit, allowance)
                # the TTFT plans below price an iteration of this budget at its predicted
                # time, at most the limit (whole tiles make it shorter than the limit)
                step = min(limit, view.perf_model.predict(BatchShape(
                    prefills=((allowance, head.num_computed),),
                    decodes=tuple(r.num_computed for r in decodes))))
        b = BatchBuilder(view, len(decodes) + allowance, cfg.max_num_seqs)
        add_decodes(b, decodes)
        after_decodes = b.tokens_used
        for req in prefills:  # ongoing prefills first, in arrival order
            if not b.removed(req) and (chunk := b.max_chunk(req)):
                b.add(req, chunk)
        give_up = cfg.late != "serve"
        dec = tuple(r.num_computed for r in decodes)
        full = False
        if cfg.shed_window and self._heap:
            ongoing = sum(prompt_work(r) for r in prefills)
            for req in self._window(b, view, ongoing, step, allowance):
                start_by = self._start_by[req.request_id]
                if give_up and not req.num_generated and doomed(
                        req, start_by, view, step, allowance, dec):
                    self._give_up(b, req, hopeless=True)
                    continue
                chunk = b.max_chunk(req)
                if chunk == 0 or not can_admit(b, req, chunk):
                    full = True
                    break
                self._unqueue(req)
                b.add(req, chunk)
        held: list[tuple[float, int, Request]] = []
        while self._heap and not full:
            entry = heapq.heappop(self._heap)
            key, _, req = entry
            if self._queued.get(req.request_id) != key or req.status is not RequestStatus.WAITING:
                continue  # stale: admitted, dropped, deferred or re-keyed since it was pushed
            if give_up and req.num_generated == 0 and doomed(
                    req, self._start_by[req.request_id], view, step, allowance, dec):
                self._give_up(b, req, hopeless=True)
                continue
            chunk = b.max_chunk(req)
            if chunk == 0 or not can_admit(b, req, chunk):
                held.append(entry)
                full = True
                break
            self._unqueue(req)
            b.add(req, chunk)
        for entry in held:
            heapq.heappush(self._heap, entry)
        if sitting and not full and b.tokens_used == after_decodes:  # no on-time prefill
            decodes = decodes + sitting  # after all: the deferred decodes run
            bg = late_prefills[0].num_computed if late_prefills else 0
            b.token_budget = max(b.tokens_used, len(decodes) + max(
                cfg.min_prefill_tokens, prefill_allowance(view, decodes, limit, cap, bg)))
            add_decodes(b, sitting)
            sitting = []
        self._gaps += len(decodes)
        if not (full or sitting) and (late_prefills or lane.queued):
            lane.admit(b, cfg, late_prefills)  # what on-time work left of the iteration
        return b.build()
