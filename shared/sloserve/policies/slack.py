"""``slack``: one policy from what the seed papers each use alone (docs/beyond.md, "Our policy").

Each iteration, for one instance:

1. **Stall-free decodes** (Sarathi-Serve §4.2): every running decode gets its
   next token; KV exhaustion preempts by recompute as vLLM does (``add_decodes``).
2. **Budget from the tightest TBT slack** (AccelGen §4.2 Eq. 6's idea, the
   per-iteration budget that fits the tightest request, Ascendra §3.3's slack
   from the perf model): a decode's slack is its next-token deadline (last
   token + its TBT SLO) minus now. The prefill tokens allowed are the most
   ``N`` whose batch — the decodes plus one prefill chunk of ``N`` — the perf
   model predicts to take at most ``tbt_margin`` x the smallest slack. Only
   on-time decodes set it: a deferred request (4, below) has missed its SLO and
   still gets a token every iteration, but its gaps do not shrink the budget of
   requests that can still make theirs. With no
   decode holding a TBT SLO the budget is ``max_num_batched_tokens`` and whole
   prompts go in at once, as vLLM's prefill-first schedule does; the budget
   never falls below ``min_prefill_tokens`` so a prompt always progresses.
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
   A request keeps its KV once admitted. Deferred decodes do not set the TBT budget
   (2) unless ``late_in_budget``: with it and a wide lane (64) ``tail`` passes on
   AccelGen's mix where the default fails, at half the goodput under overload.

Prefix caching: the prompt work a request still needs is read through
``prompt_work`` (its uncomputed tokens today; the instance's prefix lookup
already counts cached tokens as computed).

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
from sloserve.policies.slack_rules import (
    doomed,
    moore_hodgson,
    prefill_allowance,
    prefill_cost,
    prompt_work,
    smith_order,
    tbt_limit,
)
from sloserve.request import Request, RequestStatus
from sloserve.slo import next_token_deadline

SHED_REASON = "slack: cannot meet its TTFT SLO any more (predicted prefill ends past the deadline)"
LATE_REASON = "slack: shed so that more queued requests meet their TTFT (Moore-Hodgson)"
LATE_MODES = ("triage", "defer", "drop", "serve")
ORDERS = ("smith", "edf", "latest-start")


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
    late: str = knob(
        "triage", "slack: what happens to a waiting request that can no longer meet its "
        "TTFT, or that Moore-Hodgson gives up: 'triage' drops it if the load made it late "
        "(given up for others, or late while others wait) and defers it otherwise; "
        "'defer' serves every such request from a background queue (shortest prompt "
        "first) with what on-time work leaves; 'drop' ends every one with a reason; "
        "'serve' gives up nothing", choices=LATE_MODES)
    order: str = knob(
        "smith", "slack: waiting order: 'smith' (deadline order, then short first where "
        "every kept deadline allows: Smith's rule), 'edf' (deadline order), 'latest-start' "
        "(deadline - predicted prefill; the order before Smith's rule)", choices=ORDERS)
    smith_margin: float = knob(
        1.0, "slack: Smith's rule lets a prompt go last only if it still meets its TTFT "
        "with the predicted work up to its end stretched by 1 + this, so a long prompt is "
        "not pushed to the edge of its deadline (0: Smith's rule; large: EDF)", min=0.0)
    late_chunk: int = knob(
        512, "slack: most prompt tokens the deferred requests prefill per iteration, all "
        "together, so an on-time arrival never waits behind a long background iteration",
        min=1)
    late_max_running: int = knob(
        16, "slack: most deferred requests running at once (prefill or decode), so background "
        "work cannot crowd out on-time requests", min=1)
    late_yield: bool = knob(
        True, "slack: deferred decodes sit out an iteration that carries on-time prefill "
        "work (their KV stays), unless their next token is due before the next iteration "
        "could serve it (docs/beyond.md, the background lane)")
    late_in_budget: bool = knob(
        False, "slack: deferred requests' decodes set the TBT budget too (they missed their "
        "TTFT, not their TBT): with a wide lane (late_max_running 64) this keeps the pooled "
        "TBT P99 and passes `tail` on AccelGen's mix, at a cost in goodput under load "
        "(docs/beyond.md, the background lane)")
    stall_share: float = knob(
        0.002, "slack: when the first queued prompt would miss its TTFT in chunks of the "
        "budget but makes it whole, it runs whole if every on-time decode's mean TBT still "
        "meets its SLO after that long iteration, and if the decode gaps it stretches past "
        "their TBT SLO stay within this share of all decode gaps so far (the pooled P99 "
        "TBT criterion allows 1 %); 0: never", min=0.0, max=0.01)
    shed_window: int = knob(
        64, "slack: queued requests (in deadline order) that Moore-Hodgson and Smith's rule "
        "look at (0: only give up requests that cannot make it alone; plain order)", min=0)


class SlackPolicy(Policy):
    name = "slack"
    config_cls = SlackConfig
    config: SlackConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self._heap: list[tuple[float, int, Request]] = []
        self._queued: dict[str, float] = {}  # request id -> its key in the heap
        self._start_by: dict[str, float] = {}  # request id -> latest start (while queued)
        self._late_heap: list[tuple[int, int, Request]] = []  # (prompt work, seq, req)
        self._late: set[str] = set()  # ids of deferred requests still waiting
        self._late_running: dict[str, Request] = {}  # deferred requests admitted, not done
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
            self._late.add(req.request_id)
            heapq.heappush(self._late_heap, (prompt_work(req), next(self._seq), req))
        else:
            b.drop(req, SHED_REASON if hopeless else LATE_REASON)

    def _sync(self, view: InstanceView) -> None:
        """Push new arrivals; rebuild (heapify, O(n)) if the waiting queue changed otherwise."""
        for req in self._pending:
            if req.request_id not in self._queued and req.status is RequestStatus.WAITING:
                self._push(req, view)
        self._pending.clear()
        if len(self._queued) + len(self._late) == len(view.waiting):
            return
        keys, starts, late = self._queued, self._start_by, self._late
        self._queued, self._start_by, self._late = {}, {}, set()
        self._heap, self._late_heap = [], []
        for req in view.waiting:
            rid = req.request_id
            if rid in late and not req.num_generated:
                self._late.add(rid)
                self._late_heap.append((prompt_work(req), next(self._seq), req))
                continue
            key, start_by = keys.get(rid), starts.get(rid)
            if key is None or start_by is None or req.num_computed or req.num_generated:
                start_by = self.latest_start(req, view)
                key = self._key(req, start_by)
            self._queued[rid] = key
            self._start_by[rid] = start_by
            self._heap.append((key, next(self._seq), req))
        heapq.heapify(self._heap)
        heapq.heapify(self._late_heap)

    def _window(self, b: BatchBuilder, view: InstanceView, ongoing: int, limit: float,
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
        cost = prefill_cost(view, limit, allowance)
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

    def _yielding(self, view: InstanceView, decodes: list[Request], budgeted: list[Request],
                  head: Request, limit: float) -> tuple[list[Request], list[Request]]:
        """The decodes that run with on-time prefill work, and the deferred ones that sit
        it out: a deferred decode runs only if its next token is due before the next
        iteration could give it, ``now`` + 2 x this iteration's predicted time (the on-time
        decodes and ``head``'s chunk at the budget). On AccelGen's mix an on-time prompt's
        TTFT SLO is 1-1.5x its prefill alone, so any work beside it can break it."""
        cfg = self.config
        allowance = max(cfg.min_prefill_tokens, prefill_allowance(
            view, budgeted, limit, cfg.max_num_batched_tokens, head.num_computed))
        took = view.perf_model.predict(BatchShape(
            prefills=((min(allowance, prompt_work(head)), head.num_computed),),
            decodes=tuple(r.num_computed for r in budgeted)))
        horizon = view.now + 2 * took
        run, sit = list(budgeted), list[Request]()
        for r in decodes:
            if r.request_id in self._late_running:
                due = next_token_deadline(r)
                (run if due is not None and due < horizon else sit).append(r)
        return run, sit

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        self._sync(view)
        decodes = [r for r in view.running if r.is_decode]
        prefills = [r for r in view.running if r.in_prefill]
        late_prefills: list[Request] = []
        if self._late_running:
            running = RequestStatus.RUNNING
            late_ids = self._late_running = {
                rid: r for rid, r in self._late_running.items() if r.status is running}
            late_prefills = [r for r in prefills if r.request_id in late_ids]
            prefills = [r for r in prefills if r.request_id not in late_ids]
        head = (prefills[0] if prefills else self._heap[0][2] if self._heap
                else late_prefills[0] if late_prefills
                else self._late_heap[0][2] if self._late_heap else None)
        cap = cfg.max_num_batched_tokens
        # the budget protects the TBT of on-time requests; a deferred one has missed its SLO
        # (unless late_in_budget: it missed its TTFT, not its TBT)
        budgeted = decodes
        if self._late_running and not cfg.late_in_budget:
            budgeted = [r for r in decodes if r.request_id not in self._late_running]
        limit = tbt_limit(view, budgeted, cfg.tbt_margin)
        sitting: list[Request] = []
        if cfg.late_yield and head is not None and len(budgeted) < len(decodes) and (
                prefills or self._heap):
            decodes, sitting = self._yielding(view, decodes, budgeted, head, limit)
        allowance = 0
        if head is not None:
            allowance = max(cfg.min_prefill_tokens, prefill_allowance(
                view, decodes, limit, cap, head.num_computed))
            if cfg.stall_share and not prefills and limit != math.inf:
                limit, allowance = self._stall(view, decodes, budgeted, head, limit, allowance)
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
            for req in self._window(b, view, ongoing, limit, allowance):
                start_by = self._start_by[req.request_id]
                if give_up and not req.num_generated and doomed(
                        req, start_by, view, limit, allowance, dec):
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
                    req, self._start_by[req.request_id], view, limit, allowance, dec):
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
        if full or sitting or not (late_prefills or self._late_heap):
            return b.build()
        # background: deferred requests get only what on-time work left this iteration,
        # late_chunk prompt tokens at most, all together
        left = cfg.late_chunk
        for req in late_prefills:
            if not b.removed(req) and (chunk := min(b.max_chunk(req), left)):
                b.add(req, chunk)
                left -= chunk
        while self._late_heap and len(self._late_running) < cfg.late_max_running and left:
            req = self._late_heap[0][2]
            if req.request_id not in self._late or req.status is not RequestStatus.WAITING:
                heapq.heappop(self._late_heap)
                self._late.discard(req.request_id)
                continue
            chunk = min(b.max_chunk(req), left)
            if chunk == 0 or not can_admit(b, req, chunk):
                break
            heapq.heappop(self._late_heap)
            self._late.discard(req.request_id)
            self._late_running[req.request_id] = req
            b.add(req, chunk)
            left -= chunk
        return b.build()
