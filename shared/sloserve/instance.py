"""One serving instance's state: waiting queue, running set, KV blocks, policy.

nano-vllm's ``Scheduler`` split in two: the policy decides (``Policy.schedule``)
and this class applies the decision and the iteration's outcome. The simulator
and the live scheduler service drive this very class.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sloserve.batch import BatchPlan
from sloserve.kv import BlockManager
from sloserve.kv_prefix import PrefixCachingBlockManager
from sloserve.perf.base import PerfModel
from sloserve.policies.base import InstanceView, Policy
from sloserve.request import Request, RequestStatus


@dataclass(slots=True)
class TokenEvent:
    request_id: str
    index: int  # 0 = first output token
    time: float
    finished: bool
    token_id: int = -1  # the sampled id (live); -1 in simulation


class Instance:
    def __init__(
        self,
        instance_id: str,
        policy: Policy,
        kv: BlockManager,
        perf_model: PerfModel,
        role: str = "lp",
        timers: bool = False,
    ) -> None:
        self.instance_id = instance_id
        self.timers = timers  # the driver wakes the policy at an empty plan's ``wake_at``
        self.policy = policy
        self.kv = kv
        self.perf_model = perf_model
        self.role = role
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._batch_end_hook = type(policy).on_batch_end is not Policy.on_batch_end

    @property
    def has_batch_end_hook(self) -> bool:
        """Whether the policy acts after each iteration (``Policy.on_batch_end``)."""
        return self._batch_end_hook

    # --- queries ---------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting_prefills(self) -> int:
        """Requests whose first token is still to come (queued or mid-prefill)."""
        return len(self.waiting) + len([1 for r in self.running if not r.token_times])

    def view(self, now: float) -> InstanceView:
        return InstanceView(
            self.instance_id, now, self.waiting, self.running, self.kv, self.perf_model, self.role,
            self.timers,
        )

    # --- arrivals and removals ----------------------------------------------
    def add_request(self, req: Request, now: float) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request_id: {req.request_id!r} already on {self.instance_id}")
        if self.kv.blocks_for(req.prompt_len + req.output_len) > self.kv.num_blocks:
            raise ValueError(
                f"request {req.request_id}: prompt_len+output_len "
                f"{req.prompt_len + req.output_len} exceeds KV capacity "
                f"{self.kv.num_blocks * self.kv.block_size} tokens"
            )
        req.status = RequestStatus.WAITING
        if req.origin_instance is None:
            req.origin_instance = self.instance_id
        self.requests[req.request_id] = req
        self.waiting.append(req)
        if self.kv.prefix_caching:
            self._look_up_prefixes((req,))
        self.policy.on_arrival(req, now)

    def _look_up_prefixes(self, waiting: Iterable[Request]) -> None:
        """Prefix caching: a waiting request starts at its first uncached token (vLLM
        ``get_computed_blocks``); the hit is looked up, not held, until admission."""
        kv = self.kv
        assert isinstance(kv, PrefixCachingBlockManager)
        for req in waiting:
            if req.hash_ids is not None:
                req.num_computed = req.num_cached = kv.lookup(req)

    def _detach(self, req: Request) -> None:
        self.kv.free(req.request_id)
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
            req.num_computed = req.num_cached = 0  # a looked-up hit is not carried away
        del self.requests[req.request_id]

    def cancel(self, request_id: str, now: float) -> Request | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        self._detach(req)
        req.status = RequestStatus.CANCELLED
        req.finish_time = now
        return req

    def preempt_all(self) -> list[Request]:
        """The executor was lost with its KV cache: every running request goes back to
        the front of the queue to recompute (vLLM's preemption by recompute; a decode
        resumes by recomputing prompt + generated tokens). Returns them."""
        moved = list(self.running)
        for req in moved:
            self.kv.free(req.request_id)
            req.num_computed = 0
            req.num_preemptions += 1
            req.status = RequestStatus.WAITING
            self.num_preemptions += 1
        self.running = []
        for req in reversed(moved):
            self.waiting.appendleft(req)
        self.policy.on_requeued(moved)
        return moved

    # --- one iteration ----------------------------------------------------
    def schedule(self, now: float) -> tuple[BatchPlan, list[Request], list[Request]]:
        """Ask the policy for a plan and apply it: KV allocated, queues moved.

        Returns the plan and the requests it offloaded and dropped (now
        detached from this instance; the caller re-routes or reports them).
        """
        caching = self.kv.prefix_caching
        if caching:
            self._look_up_prefixes(self.waiting)
        plan = self.policy.schedule(self.view(now))
        if plan.wake_at is not None:
            self._check_wake(plan, now)
        for rid in plan.preempted:
            req = self.requests[rid]
            if req not in self.running:
                raise ValueError(f"plan: preempted {rid} is not running")
            self.kv.free(rid)
            self.running.remove(req)
            req.num_computed = req.num_cached = 0
            req.num_preemptions += 1
            req.status = RequestStatus.WAITING
            self.num_preemptions += 1
        if plan.preempted:  # they go back to the front in arrival order (vLLM recompute)
            back = sorted((self.requests[rid] for rid in plan.preempted),
                          key=lambda r: r.arrival_time)
            for req in reversed(back):
                self.waiting.appendleft(req)
        offloaded = (self._take(plan.offloaded, RequestStatus.OFFLOADED, now)
                     if plan.offloaded else [])
        dropped = (self._take(plan.dropped, RequestStatus.DROPPED, now, plan.drop_reasons)
                   if plan.dropped else [])
        admitted: list[Request] = []
        requests, kv, bs = self.requests, self.kv, self.kv.block_size
        pkv = kv if isinstance(kv, PrefixCachingBlockManager) else None
        if pkv is not None:  # admitted requests take their hits before allocations can evict
            self._acquire_prefixes(plan)
        waiting, running = RequestStatus.WAITING, RequestStatus.RUNNING
        for item in plan.items:  # per request per iteration: kept tight
            rid, n, ctx, _ = item
            req = requests[rid]
            c = req.num_computed
            if ctx != c or n > req.prompt_len + req.num_generated - c:
                raise ValueError(f"plan: item {item} inconsistent with request state")
            # a request holds ceil(c / bs) blocks: it needs more only past a block boundary
            m = c % bs
            if not m or m + n > bs:
                kv.allocate(rid, c + n)
            if pkv is not None and m + n >= bs:  # a block became full
                pkv.cache_full_blocks(req, c + n)
            if req.status is waiting:  # only here does a request start running
                admitted.append(req)
                req.status = running
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
        if admitted:
            self._unqueue(admitted)
            self.running.extend(admitted)
        return plan, offloaded, dropped

    def _check_wake(self, plan: BatchPlan, now: float) -> None:
        """A timer only on an empty plan, only where the driver offers timers, and only
        later than ``now`` (else the driver would ask again at once, for ever)."""
        name, wake = type(self.policy).__name__, plan.wake_at
        assert wake is not None
        if plan.items:
            raise ValueError(f"plan.wake_at: {name} set a timer on a plan with items")
        if not self.timers:
            raise ValueError(f"plan.wake_at: {name} set a timer; this driver offers none")
        if not wake > now:  # also NaN
            raise ValueError(f"plan.wake_at: {name} asked to wake at {wake!r}, "
                             f"not after now ({now!r})")

    def _unqueue(self, admitted: list[Request]) -> None:
        """Take ``admitted`` out of the waiting queue, keeping its order. FCFS policies
        admit from the front (``popleft``); others remove in place (a C-level scan up
        to the request) rather than rebuilding the whole queue every iteration."""
        waiting = self.waiting
        try:
            for req in admitted:
                if waiting and waiting[0] is req:
                    waiting.popleft()
                else:
                    waiting.remove(req)  # Request compares by identity (eq=False)
        except ValueError:  # not queued: cannot happen while status WAITING means queued
            ids = {r.request_id for r in admitted}
            self.waiting = deque(r for r in waiting if r.request_id not in ids)

    def _acquire_prefixes(self, plan: BatchPlan) -> None:
        kv = self.kv
        assert isinstance(kv, PrefixCachingBlockManager)
        for item in plan.items:
            req = self.requests[item.request_id]
            if req.status is RequestStatus.WAITING:
                hit = kv.acquire(req)
                if hit != req.num_cached:
                    raise ValueError(f"plan: {req.request_id}'s prefix hit changed from "
                                     f"{req.num_cached} to {hit} tokens before admission")

    def _take(
        self, ids: Iterable[str], status: RequestStatus, now: float,
        reasons: Mapping[str, str] | None = None,
    ) -> list[Request]:
        reasons = {} if reasons is None else reasons
        out = []
        for rid in ids:
            req = self.requests[rid]
            self._detach(req)
            req.status = status
            if status is RequestStatus.DROPPED:
                req.finish_time = now
                req.drop_reason = reasons.get(rid)
            out.append(req)
        return out

    def complete(
        self, plan: BatchPlan, end_time: float, stopped: Iterable[str] = (),
        sampled: Mapping[str, int] | None = None, *, every_token: bool = True,
    ) -> list[TokenEvent]:
        """Apply an executed plan: advance progress, emit tokens, finish requests.

        ``stopped`` names requests the executor ended early (EOS, stop string);
        ``sampled`` the token id each sampling request got (live executors),
        kept in ``Request.output_token_ids``. ``every_token=False`` (the simulator,
        which streams nothing) returns only the events the controller acts on: first
        tokens and finishing ones; every token is still recorded in ``token_times``.
        """
        stop = set(stopped)
        events: list[TokenEvent] = []
        finished = RequestStatus.FINISHED
        requests = self.requests
        if sampled is not None:  # live: keep the ids (before finished requests detach)
            for rid, tok in sampled.items():
                if (r := requests.get(rid)) is not None:
                    if r.output_token_ids is None:
                        r.output_token_ids = []
                    r.output_token_ids.append(tok)
        get, emit = requests.get, events.append
        for rid, n, _, _ in plan.items:  # per request per iteration: kept tight
            req = get(rid)
            if req is None:  # cancelled while the batch ran
                continue
            c = req.num_computed + n
            req.num_computed = c
            g = req.num_generated
            if c < req.prompt_len + g:
                continue
            req.num_generated = g = g + 1
            req.token_times.append(end_time)
            if g < req.output_len and rid not in stop:
                if every_token or g == 1:
                    emit(TokenEvent(rid, g - 1, end_time, False))
                continue
            emit(TokenEvent(rid, g - 1, end_time, True))
            self._detach(req)
            req.status = finished
            req.finish_time = end_time
        if sampled is not None:
            for ev in events:
                ev.token_id = sampled[ev.request_id]
        if self._batch_end_hook:  # most policies have none: skip building their view
            self.policy.on_batch_end(self.view(end_time), plan)
        return events
