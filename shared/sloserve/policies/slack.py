"""``slack``: one policy from what the seed papers each use alone (docs/lab/beyond.md, "Our
policy", has each rule with its paper section, its knob and what was measured).

Each iteration, for one instance:

1. **Stall-free decodes** (Sarathi-Serve §4.2): every running decode gets its next token;
   KV exhaustion preempts by recompute, as vLLM does.
2. **A token budget from the tightest TBT slack** (AccelGen §4.2 Eq. 6's idea; Ascendra
   §3.3's slack from the perf model): the most prefill tokens whose batch is predicted to
   take at most ``tbt_margin`` x the smallest next-token slack of the on-time decodes (the
   deferred ones', ``late_bound``, where none), cut to whole tiles (Sarathi-Serve §4.3);
   no TBT-bound decode: whole prompts, as vLLM. **A stall that saves a request**
   (``slack_stall``): a prompt that misses its TTFT in chunks but makes it whole goes in
   whole, as vLLM's prefill-first schedule would, as often as the P99 TBT allows; a
   *tight* one (TTFT SLO near its prefill alone) that the decodes beside it would make
   late goes alone, the decodes waiting one iteration (vLLM's prefill-only iteration).
3. **Which prompts, in which order** (Ascendra §2 and §5.2: short first, long ones in
   time), exact on a one-machine model of prefill: waiting requests sit in a heap on their
   next-token deadline (EDF, Ascendra §3.3); a request whose latest start has passed, or
   whose prompt needs more iterations than its TTFT leaves, is ``doomed``; over the first
   ``shed_window`` requests **Moore-Hodgson** (1968) keeps the most on time and **Smith's
   backward rule** (1956, with ``SMITH_MARGIN``) orders them short first wherever every
   kept deadline allows. Ongoing prefills and preempted requests go first. **The first
   token** (ours; a token comes when its iteration ends, Orca's iteration-level
   scheduling): once the iteration completes an on-time prompt, more prefill goes in only
   while ``first_token_cap`` x its predicted time still ends by that prompt's deadline.
4. **Requests given up** (``late``, default ``triage``; Ascendra §6.3 drops under
   overload): one the load made late is dropped with a reason; one that never could make
   its TTFT, or missed it only by waiting for the running iteration alone in the queue, is
   deferred to the background lane (``slack_lane``), served with what on-time work leaves.

Prefix caching: a request's prompt work is read through ``prompt_work`` (the instance's
prefix lookup already counts cached tokens as computed).

Config: ``SlackConfig`` (``slack_config``); the rules as functions: ``slack_rules``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

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
from sloserve.policies.slack_pace import DecodePacer
from sloserve.policies.slack_rules import (
    doomed,
    first_token_room,
    moore_hodgson,
    prefill_allowance,
    prefill_cost,
    prompt_work,
    smith_order,
    tbt_limit,
    tile_aligned,
)
from sloserve.policies.slack_stall import StallRule
from sloserve.request import Request, RequestStatus
from sloserve.slo import next_token_deadline

__all__ = ["LATE_REASON", "SHED_REASON", "SlackConfig", "SlackPolicy"]

SHED_REASON = "slack: cannot meet its TTFT SLO any more (predicted prefill ends past the deadline)"
LATE_REASON = "slack: shed so that more queued requests meet their TTFT (Moore-Hodgson)"
SMITH_MARGIN = 1.0
"""Smith's rule lets a prompt go last only if it still meets its TTFT with the predicted
work up to its end stretched by 1 + this, so a long prompt is not pushed to the edge of its
deadline (0: Smith's rule; large: EDF). A knob until issue 32; no grid run moved it from
1.0 (docs/lab/beyond.md, "Smith's rule with a margin", has the values tried by hand)."""


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
        self._stalls = StallRule()  # the decode gaps planned, and those seen past the tail
        self._pacer = DecodePacer()  # recent arrivals: when a held decode iteration runs
        self._arrived = 0  # requests this instance was given (the drop budget's base)
        self._dropped = 0  # requests triage dropped

    def on_arrival(self, req: Request, now: float) -> None:
        self._pending.append(req)
        self._arrived += 1

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
        or it missed by waiting for a running iteration with nobody else in the queue, or
        the drops so far have spent ``drop_budget``."""
        contended = not hopeless or len(self._queued) > 1
        never = self._start_by[req.request_id] < req.arrival_time
        self._unqueue(req)
        mode = self.config.late
        if mode == "triage" and not never and contended and self._may_drop():
            self._dropped += 1
        elif mode != "drop":
            self._lane.defer(req)
            return
        b.drop(req, SHED_REASON if hopeless else LATE_REASON)

    def _may_drop(self) -> bool:
        """Whether one more drop keeps triage's drops within ``drop_budget`` of the requests
        this instance was given (issue 38: a burst must not buy goodput with refusals over
        the tail criterion's bound; past it, triage defers)."""
        return self._dropped + 1 <= self.config.drop_budget * self._arrived

    def _sync(self, view: InstanceView) -> None:
        """Push new arrivals; rebuild (heapify, O(n)) if the waiting queue changed otherwise."""
        for req in self._pending:
            if req.request_id not in self._queued and req.status is RequestStatus.WAITING:
                self._push(req, view)
                self._pacer.arrived(prompt_work(req),
                                    self._start_by[req.request_id] - req.arrival_time)
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
            return first + smith_order(jobs, start, SMITH_MARGIN)
        return first + [j[2] for j in jobs]

    def _first_token(self, b: BatchBuilder, view: InstanceView, req: Request, chunk: int
                     ) -> None:
        """If this iteration completes ``req``'s prefill on time, its budget shrinks to what
        keeps the iteration, predicted and stretched by ``first_token_cap``, within ``req``'s
        TTFT deadline: the work after it would delay its first token."""
        stretch, deadline = self.config.first_token_cap, req.ttft_deadline
        if (stretch and deadline is not None and not req.num_generated
                and chunk >= prompt_work(req)):
            room = first_token_room(view, b.shape(), deadline, stretch, b.tokens_left)
            if room is not None:
                b.token_budget = b.tokens_used + room

    def schedule(self, view: InstanceView) -> BatchPlan:
        """One iteration: the rules below in order (module docstring, 1-4)."""
        cfg = self.config
        self._sync(view)
        decodes = [r for r in view.running if r.is_decode]
        paced = self._pace(view, decodes)
        if paced is not None:
            return paced
        if cfg.stall_share:
            self._stalls.observe(cfg, view.running)
        prefills, late_prefills = self._lane.split([r for r in view.running if r.in_prefill])
        head = (prefills[0] if prefills else self._heap[0][2] if self._heap
                else late_prefills[0] if late_prefills else self._lane.first_waiting)
        it = self._budget(view, decodes, prefills, head)
        b = BatchBuilder(view, len(it.decodes) + it.allowance, cfg.max_num_seqs)
        add_decodes(b, it.decodes)
        after_decodes = b.tokens_used
        for req in prefills:  # ongoing prefills first, in arrival order
            if not b.removed(req) and (chunk := b.max_chunk(req)):
                b.add(req, chunk)
                self._first_token(b, view, req, chunk)
        full = self._admit_window(b, view, prefills, it) or self._admit_queue(b, view, it)
        if it.sitting and not full and b.tokens_used == after_decodes:  # no on-time prefill
            self._seat_deferred(b, view, it, late_prefills)
        self._stalls.gaps += len(it.decodes)
        if not (full or it.sitting) and (late_prefills or self._lane.queued):
            self._lane.admit(b, cfg, late_prefills)  # what on-time work left of the iteration
        return b.build()

    def _pace(self, view: InstanceView, decodes: list[Request]) -> BatchPlan | None:
        """Only decodes run and nothing waits: perhaps hold the next iteration, the GPU idle
        so that a tight prompt starts at once (``slack_pace``; ours)."""
        if view.timers and decodes and len(decodes) == len(view.running) and not view.waiting:
            wake = self._pacer.wake_at(view, decodes, self.config)
            if wake is not None:
                return BatchPlan(wake_at=wake)
        return None

    def _tbt_limit(self, view: InstanceView, decodes: list[Request], head: Request | None
                   ) -> tuple[float, list[Request]]:
        """``(limit, budgeted)``: the most an iteration may take from the tightest next-token
        slack of the on-time decodes (AccelGen §4.2 Eq. 6, Ascendra §3.3), narrowed by the
        deferred decodes' where ``late_bound`` says (``slack_lane``). The budget protects the
        TBT of on-time requests; a deferred one has missed its SLO (unless
        ``late_in_budget``: it missed its TTFT, not its TBT)."""
        cfg, lane = self.config, self._lane
        budgeted = decodes
        if lane.running and not cfg.late_in_budget:
            budgeted = [r for r in decodes if r.request_id not in lane.running]
        limit = tbt_limit(view, budgeted, cfg.tbt_margin)
        if head is not None and len(budgeted) < len(decodes) and narrows(cfg, limit):
            limit = lane.narrow(view, cfg, decodes, head, limit, self.latest_start(head, view))
        return limit, budgeted

    def _budget(self, view: InstanceView, decodes: list[Request], prefills: list[Request],
                head: Request | None) -> _Iteration:
        """This iteration's decodes and prefill allowance (rule 2): the TBT limit's most
        prefill tokens (at least ``min_prefill_tokens``), cut to whole tiles (Sarathi-Serve
        §4.3) when the limit binds, widened to a whole prompt by the stall rule
        (``slack_stall``); deferred decodes may sit out (``late_yield``)."""
        cfg = self.config
        limit, budgeted = self._tbt_limit(view, decodes, head)
        sitting: list[Request] = []
        if cfg.late_yield and head is not None and len(budgeted) < len(decodes) and (
                prefills or self._heap):
            decodes, sitting = self._lane.yielding(view, cfg, decodes, budgeted, head, limit)
        allowance, step, bound = 0, limit, limit  # bound: the TBT limit before any stall
        if head is not None:
            allowance = max(cfg.min_prefill_tokens, prefill_allowance(
                view, decodes, limit, cfg.max_num_batched_tokens, head.num_computed))
            if limit != math.inf:  # a TBT-bounded iteration: whole tiles
                allowance = tile_aligned(allowance, len(decodes), cfg.tile)
                if cfg.stall_share and not prefills and head.request_id in self._queued:
                    limit, allowance, alone = self._stalls.widen(
                        view, cfg, decodes, budgeted, head, self._start_by[head.request_id],
                        limit, allowance)
                    if alone:  # a prefill-only iteration: the decodes wait for it
                        decodes, sitting = [], sitting + decodes
                # the TTFT plans below price an iteration of this budget at its predicted
                # time, at most the limit (whole tiles make it shorter than the limit)
                step = min(limit, view.perf_model.predict(BatchShape(
                    prefills=((allowance, head.num_computed),),
                    decodes=tuple(r.num_computed for r in decodes))))
        return _Iteration(decodes, sitting, allowance, step, bound)

    def _take(self, b: BatchBuilder, view: InstanceView, req: Request, it: _Iteration
              ) -> bool:
        """Admit ``req``'s next chunk, or give it up when it is ``doomed`` (rule 4); False,
        admitting nothing, when the iteration is full."""
        if self.config.late != "serve" and not req.num_generated and doomed(
                req, self._start_by[req.request_id], view, it.step, it.allowance, it.dec):
            self._give_up(b, req, hopeless=True)
            return True
        chunk = b.max_chunk(req)
        if chunk == 0 or not can_admit(b, req, chunk):
            return False
        self._unqueue(req)
        b.add(req, chunk)
        self._first_token(b, view, req, chunk)
        return True

    def _admit_window(self, b: BatchBuilder, view: InstanceView, prefills: list[Request],
                      it: _Iteration) -> bool:
        """The first ``shed_window`` queued requests in Moore-Hodgson's and Smith's order
        (rule 3, ``_window``); True when the iteration filled."""
        if not (self.config.shed_window and self._heap):
            return False
        ongoing = sum(prompt_work(r) for r in prefills)
        for req in self._window(b, view, ongoing, it.step, it.allowance):
            if not self._take(b, view, req, it):
                return True
        return False

    def _admit_queue(self, b: BatchBuilder, view: InstanceView, it: _Iteration) -> bool:
        """The rest of the queue in key order (EDF, Ascendra §3.3) while the iteration has
        room; True when it filled (the request that did not fit stays queued)."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            key, _, req = entry
            if self._queued.get(req.request_id) != key or req.status is not RequestStatus.WAITING:
                continue  # stale: admitted, dropped, deferred or re-keyed since it was pushed
            if not self._take(b, view, req, it):
                heapq.heappush(self._heap, entry)
                return True
        return False

    def _seat_deferred(self, b: BatchBuilder, view: InstanceView, it: _Iteration,
                       late_prefills: list[Request]) -> None:
        """No on-time prefill went in after all: the deferred decodes that sat out run, the
        budget re-priced with them under the TBT limit before any stall (``slack_lane``)."""
        cfg = self.config
        it.decodes = it.decodes + it.sitting
        bg = late_prefills[0].num_computed if late_prefills else 0
        b.token_budget = max(b.tokens_used, len(it.decodes) + max(
            cfg.min_prefill_tokens, prefill_allowance(
                view, it.decodes, it.bound, cfg.max_num_batched_tokens, bg)))
        add_decodes(b, it.sitting)
        it.sitting = []


@dataclass(slots=True)
class _Iteration:
    """What ``SlackPolicy._budget`` decided for one iteration: the decodes it runs, the
    deferred ones sitting out, the prefill allowance, the predicted time of an iteration of
    that allowance (``step``) and the TBT limit before any stall (``bound``)."""

    decodes: list[Request]
    sitting: list[Request]
    allowance: int
    step: float
    bound: float
    dec: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.dec = tuple(r.num_computed for r in self.decodes)
