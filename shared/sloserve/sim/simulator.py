"""Per-iteration discrete-event simulator (docs/design.md: one implementation, two drivers).

Each instance is a ``sloserve.instance.Instance`` with its policy, stepped by the
core's ``InstanceDriver`` (``sloserve.driver``: decide, launch, land) as the live
scheduler steps its own; the core ``Controller`` places arrivals, offloads and
drops exactly as it does in the gateway: this driver only carries out its actions
and times batches. Every
batch's duration comes from a ground-truth ``TimingSource`` (real GPU
profiles); the policies only ever see an ``AscendraRegression`` warm-started
from a profiling sweep of *measured* samples and refitted online from every
executed batch, as the live perf-model service does.

With ``cfg.overlap`` (``simulate --overlap``) the instances run the live scheduler's
overlap scheduling (on by default there: vLLM's async scheduling, SGLang's overlap
scheduler): plan k+1 is decided as soon as plan k has left, with plan k applied
(``InstanceDriver.launch``), and starts the moment k ends. Two things follow that the
serial timeline does not have, and both move TTFT and batch composition:

* a request that arrives while batch k runs is first considered for k+2 (plan
  k+1 was decided at k's start), i.e. up to one iteration later;
* a decision sees the state *after* the batch that is still running (its
  finished requests gone, its KV freed, its decodes one token further).

When a batch starts, the next plan is decided at once (``now`` = the start) and
applied straight away, ending at the time it will end (the simulator knows the
ground truth; the live scheduler uses the predicted end until the result arrives,
then the real one). Its tokens reach the controller when the batch ends. When a
batch ends with no plan decided (the decision at its start was empty), the next is
decided then, as the live loop waits for the result and decides again. A request
that wakes an idle instance is planned at once. Not modelled: executor-side early
stops (the sim backend has no EOS), and the live scheduler's provisional token
times (predicted end) between a decision and its result.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sloserve.admission import for_deployment
from sloserve.batch import BatchPlan, BatchSample
from sloserve.controller import Action, Controller, Dispatch
from sloserve.deployment import REFIT_EVERY
from sloserve.driver import Flight, InstanceDriver
from sloserve.instance import Instance, TokenEvent
from sloserve.kv import BlockManager
from sloserve.kv_prefix import PREFIX_UNIT, PrefixCachingBlockManager, prefix_counts
from sloserve.metrics import RunSummary
from sloserve.perf.base import TimingSource
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import ModelShape, get_model
from sloserve.perf.noise import stream_seed
from sloserve.perf.regression import AscendraRegression
from sloserve.perf.sweep import profile_sweep
from sloserve.policies import get_spec, instance_roles
from sloserve.policies.base import Policy
from sloserve.request import Request, RequestStatus
from sloserve.routing_prefix import PrefixRouter
from sloserve.sim.config import SimConfig
from sloserve.sim.deferred import DeferredObservations
from sloserve.sim.events import WAKE, BatchEnds, arrival_order
from sloserve.sim.overhead import (
    ControllerLag,
    DeliverySampler,
    OverheadProfile,
    OverheadSampler,
)
from sloserve.sim.report import RunTotals, run_summary
from sloserve.sim.split import PartObservations
from sloserve.sim.steady import DecodeTimes, SteadyRun
from sloserve.sketch import QuantileSketch
from sloserve.workload.generate import Workload, make_requests
from sloserve.workload.multiturn import MULTITURN, multiturn_requests
from sloserve.workload.traces import TraceRequest, load_trace, load_trace_file

GC_YOUNG = 50_000  # allocations between young GC collections during a run (see quiet_gc)
FOLD_EVERY = 512  # streaming metrics: finished requests folded into the summary at a time


def build_timing(cfg: SimConfig) -> TimingSource:
    if cfg.timing is not None:
        return cfg.timing
    if cfg.timing_profile is not None:
        from sloserve.perf.measured import MeasuredTiming

        return MeasuredTiming.from_file(cfg.timing_profile, seed=cfg.truth_seed,
                                        noise_cv=cfg.noise_cv)
    from sloserve.perf.ground_truth import ProfileTiming

    return ProfileTiming(cfg.model, cfg.gpu, seed=cfg.truth_seed, noise_cv=cfg.noise_cv,
                         tp=cfg.tp)


def instance_timings(cfg: SimConfig, timing: TimingSource,
                     indices: list[int]) -> list[TimingSource]:
    """The ground truth of each instance (by overall index): ``timing`` itself, or with
    ``noise_streams="instance"`` a copy drawing from that instance's own noise stream."""
    if cfg.noise_streams == "run":
        return [timing] * len(indices)
    own = getattr(timing, "with_noise_stream", None)
    if own is None:
        raise ValueError("noise_streams (--noise-streams): 'instance' needs a ground truth "
                         f"with with_noise_stream, not a {type(timing).__name__}")
    return [own(stream_seed(cfg.truth_seed, k)) for k in indices]


def build_workload(cfg: SimConfig, model: ModelShape, timing: TimingSource) -> Workload:
    """Requests for ``cfg``; ``timing`` measures the prompt latencies that AccelGen's
    heterogeneous TTFT SLOs are scaled from (§6.1), as the paper measured them. With
    ``cfg.arrival_times`` the requests arrive at those offsets instead (a replay)."""
    w = _generate(cfg, model, timing)
    if cfg.arrival_times is not None:
        if len(cfg.arrival_times) != len(w.requests):
            raise ValueError(f"arrival_times: {len(cfg.arrival_times)} offsets for "
                             f"{len(w.requests)} requests")
        for r, t in zip(w.requests, cfg.arrival_times):
            r.arrival_time = t
    return w


def _generate(cfg: SimConfig, model: ModelShape, timing: TimingSource) -> Workload:
    if cfg.trace == MULTITURN:
        return multiturn_requests(num_requests=cfg.num_requests, qps=cfg.qps, seed=cfg.seed,
                                  ttft_slo=cfg.ttft_slo, tbt_slo=cfg.tbt_slo,
                                  max_context=model.max_context)
    if cfg.fixed_lengths is not None:
        p, o = cfg.fixed_lengths
        lengths = [TraceRequest(p, o, None)]
    elif cfg.trace_file is not None:
        lengths = load_trace_file(cfg.trace_file)
    else:
        assert cfg.trace is not None
        lengths = load_trace(cfg.trace)
    return make_requests(
        lengths,
        num_requests=cfg.num_requests,
        qps=cfg.qps,
        arrival=cfg.arrival,
        cv=cfg.cv,
        seed=cfg.seed,
        ttft_slo=cfg.ttft_slo,
        tbt_slo=cfg.tbt_slo,
        slo_mix=cfg.slo_mix,
        jct_share=cfg.jct_share,
        batch_time=timing.batch_time if cfg.slo_mix else None,
        max_context=model.max_context,
        sample=cfg.sample,
    )


@contextmanager
def quiet_gc(young: int = GC_YOUNG) -> Iterator[None]:
    """Cyclic GC tuned for a run (no result depends on it): everything built so far (the
    whole up-front workload) is frozen out of full collections, and young collections
    come every ``young`` allocations instead of CPython's 700, so the plans, items and
    events of in-flight batches are not walked and promoted over and over. Restored
    on exit."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], young), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Simulation:
    """One run: instances, router, shared online perf model, event queue. ``part=(g, n)``
    simulates only the instances whose index is ``g`` mod ``n`` (``sim.parallel``): every
    arrival is still routed, and one routed elsewhere leaves this part at once."""

    def __init__(self, cfg: SimConfig, part: tuple[int, int] | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.model = get_model(cfg.model)
        self.timing = build_timing(cfg)
        profile, hw = self._build_truth(cfg, part)
        timings = self._build_instances(cfg, part, hw)
        self._batch_time = [t.batch_time for t in timings]
        self.plans: list[tuple[str, float, float, BatchPlan]] | None = (
            [] if cfg.record_decisions else None)  # (instance, start, end, plan): protocol tests
        self.admission = (None if cfg.admission is None
                          else for_deployment(cfg.admission, cfg.hp_instances))
        self.ends = BatchEnds()
        # reports on their way to the controller (``cfg.controller_lag``): heap entries with
        # a negative index, each a batch's tokens and its instance's state
        self.lag = (ControllerLag(profile, cfg.seed, len(self.instances))
                    if cfg.controller_lag and profile is not None else None)
        self._reports: dict[int, tuple[list[TokenEvent], tuple[int, float, int, bool]]] = {}
        self._report_seq = 0
        self.requests = {r.request_id: r for r in self.workload.requests}
        # the batch each instance runs: a launched plan, or a steady run (sim.steady)
        self.in_flight: list[Flight | SteadyRun | None] = [None] * len(self.instances)
        # overlap: the plan decided (and applied) while the one in flight runs
        self.queued: list[Flight | None] = [None] * len(self.instances)
        self.batch_start = [0.0] * len(self.instances)
        self.samples: list[BatchSample] = []
        self.record_samples = cfg.record_samples
        self.sample_times: list[float] = []  # virtual start time of each recorded sample
        self.num_iterations = 0
        self.num_offloads = 0
        self.kv_util_sum = 0.0
        # policies that decide tickets themselves get a view; the rest always offer one
        self._ticket_hook = [type(i.policy).offers_ticket is not Policy.offers_ticket
                             for i in self.instances]
        # steady runs (sim.steady): most decodes each instance's policy promises a plan for
        self._decode_times: list[DecodeTimes | None] = [
            getattr(t, "decode_batch_times", None) for t in timings]
        self._steady_limit = [self._steady_limit_of(k) for k in range(len(self.instances))]
        self.num_steady = 0  # iterations started in steady runs (no policy call), at run ends
        # streaming metrics (cfg.metrics == "stream"): finished requests are folded into a
        # constant-size summary in chunks and released (sloserve.sketch)
        self.stream: RunSummary | None = None
        self._retired: list[Request] = []
        if cfg.metrics == "stream":
            self.stream = RunSummary(QuantileSketch)

    def _build_truth(self, cfg: SimConfig,
                     part: tuple[int, int] | None) -> tuple[OverheadProfile | None, Any]:
        """The ground truth's extras (overhead gaps, delivery lags) and the online perf model
        the policies learn from (never handed the ground truth: DESIGN, "sim")."""
        # the simulated executor's idle gap between back-to-back batches (the live stack's
        # measured service overhead): part of the ground truth, never seen by a policy
        profile = None if cfg.overhead_profile is None else OverheadProfile.load(
            cfg.overhead_profile)
        self.overhead = None if profile is None else OverheadSampler(profile, cfg.seed)
        # the gateway's delivery of each token, where the profile measured it: only what is
        # reported moves (tokens as the client gets them), never what is scheduled
        self.delivery = (DeliverySampler(profile, cfg.seed)
                         if profile is not None and profile.delivery_s else None)
        if cfg.controller_lag and (profile is None or not profile.delivery_s):
            raise ValueError(f"controller_lag (--controller-lag): {cfg.overhead_profile} has no "
                             f"delivery samples (measured by `bench --overhead-out`)")
        hw = get_hardware(cfg.gpu) if cfg.timing_profile is None else get_hardware("cpu")
        self.perf_model = AscendraRegression(self.model, hw, tp=cfg.tp, refit_every=REFIT_EVERY)
        if cfg.perf_model == "online":
            self.perf_model.fit(profile_sweep(self.timing, self.model, seed=cfg.truth_seed))
        else:  # the roofline, frozen: the same predictions in every driver (protocol tests)
            self.perf_model.refit_every = 1 << 62
        # what the policies see: the same model, its observations applied lazily (sim.deferred)
        # (a part of a split run: only what cannot differ from the whole run's, ``sim.split``)
        self.policy_perf = (DeferredObservations if part is None
                            else PartObservations)(self.perf_model, cfg.refit_interval)
        self._clock = cfg.refit_interval is not None  # refits on simulated time: advance it
        return profile, hw

    def _build_instances(self, cfg: SimConfig, part: tuple[int, int] | None,
                         hw: Any) -> list[TimingSource]:
        """The workload, this part's instances with their drivers, the controller; each
        instance's ground-truth timing."""
        num_blocks = cfg.num_blocks or self._kv_blocks(hw)
        spec, self.policy_config = get_spec(cfg.policy), cfg.resolved_policy_config()
        self.workload = build_workload(cfg, self.model, self.timing)
        # no prefix identity, nothing to share: the plain manager (results unchanged)
        caching = cfg.prefix_caching and any(
            r.hash_ids is not None for r in self.workload.requests)

        def kv() -> BlockManager:
            return (PrefixCachingBlockManager(num_blocks, cfg.block_size,
                                              cache_outputs=cfg.prefix_cache_outputs)
                    if caching else BlockManager(num_blocks, cfg.block_size))
        roles = instance_roles(cfg.policy, cfg.instances, cfg.hp_instances)
        mine = [k for k in range(len(roles)) if part is None or k % part[1] == part[0]]
        self.instances = [
            Instance(
                roles[k][0],
                spec.make(roles[k][1], self.policy_config, num_hp=cfg.hp_instances),
                kv(),
                self.policy_perf,
                role=roles[k][1],
                timers=True,  # the event heap holds policy timers (``sim.events.WAKE``)
            )
            for k in mine
        ]
        self.index = {inst.instance_id: k for k, inst in enumerate(self.instances)}
        self.overlap = bool(cfg.overlap)  # None: the simulator's own default, off
        self.drivers = [InstanceDriver(inst, overlap=self.overlap, simulated=True)
                        for inst in self.instances]
        router = PrefixRouter([iid for iid, _ in roles],
                              capacity_units=num_blocks * cfg.block_size // PREFIX_UNIT or 1,
                              ) if cfg.prefix_routing else None
        # every instance, this part's or not: arrivals are placed as in one process
        self.controller = Controller(roles, record=cfg.record_decisions, prefix_router=router)
        return instance_timings(cfg, self.timing, mine)

    def _steady_limit_of(self, k: int) -> int:
        """Instance ``k``'s policy's ``steady_decodes``, or 0 where this driver would have
        to see each iteration: a hook, a plan or sample record, an overhead gap, prefix
        caching, a ground truth without ``decode_batch_times``, or steady runs turned off."""
        inst, cfg = self.instances[k], self.cfg
        if (not cfg.steady or self._decode_times[k] is None or cfg.overlap or cfg.record_samples
                or cfg.record_decisions or self.overhead is not None or inst.kv.prefix_caching
                or self._ticket_hook[k] or inst.has_batch_end_hook):
            return 0
        return inst.policy.steady_decodes()

    def _kv_blocks(self, hw: Any) -> int:
        from sloserve.perf.memory import kv_capacity_blocks

        return kv_capacity_blocks(self.model, hw, self.cfg.block_size, tp=self.cfg.tp)

    # --- driving ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        end = self.run_events()
        return self._summary(end, time.perf_counter() - wall0)

    def run_events(self) -> float:
        """Every event, without the summary (``sim.parallel``): the last one's time."""
        with quiet_gc():
            return self._run()

    def _run(self) -> float:
        """Every event, in order; the last one's time."""
        reqs: list[Request | None] = list(self.workload.requests)  # each dropped on arrival
        times = [r.arrival_time for r in self.workload.requests]
        if self.stream is not None:
            self.workload.requests = []  # released as they finish
        heap, pop = self.ends.heap, heapq.heappop
        admit, carry_out, finish = self.controller.admit, self._carry_out, self._finish_batch
        clock = self.policy_perf.advance if self._clock else None
        now = 0.0
        for k in arrival_order(times):
            t = times[k]
            while heap and heap[0][0] <= t:  # batch ends first at equal times
                now, _, inst = pop(heap)
                finish(inst, now, t)
            now = t
            if clock is not None:
                clock(now)
            req = reqs[k]
            reqs[k] = None
            assert req is not None
            carry_out(admit(req, now), now)
        while heap:
            now, _, inst = pop(heap)
            finish(inst, now, math.inf)
        self.policy_perf.flush()  # the model as it would be after every observation
        return now

    def _carry_out(self, action: Action, now: float) -> None:
        """Do what the controller decided: place a request, or end it as dropped."""
        req = self.requests[action.request_id]
        if isinstance(action, Dispatch):
            k = self.index.get(action.instance_id)
            if k is None:  # another part's instance (``part``): it leaves this one
                self.controller.on_cancel(action.request_id, now)
                del self.requests[action.request_id]
                return
            run = self.in_flight[k]
            if isinstance(run, SteadyRun):  # it is looked at and changed: written back first,
                run.write_back()  # and its iteration in flight is its last steady one
                run.stop = True
            if self.drivers[k].refusal(req, now, now, self.admission) is not None:
                for a in self.controller.on_scheduled(action.instance_id, [], [req], now):
                    self._carry_out(a, now)  # refused at the door: a drop, as live
                return
            self.instances[k].add_request(req, now)
            self._kick(k, now)
        else:
            req.status, req.finish_time = RequestStatus.DROPPED, now
            if self.stream is not None:
                self._retire(req.request_id)

    def _retire(self, request_id: str) -> None:
        """Streaming metrics: a finished or dropped request leaves the simulator."""
        self._retired.append(self.requests.pop(request_id))
        if len(self._retired) >= FOLD_EVERY:
            assert self.stream is not None
            self.stream.add(self._delivered(self._retired))
            self._retired = []

    def _delivered(self, reqs: list[Request]) -> list[Request]:
        """``reqs`` as measured: with a delivery profile, copies timed as the gateway
        would deliver their tokens (``sim.overhead.DeliverySampler``)."""
        if self.delivery is None:
            return reqs
        out = []
        for r in reqs:
            times = self.delivery.delivered(r.request_id, r.token_times)
            finish = r.finish_time
            if finish is not None and times and r.status is RequestStatus.FINISHED:
                finish = max(finish, times[-1])
            out.append(dataclasses.replace(r, token_times=times, finish_time=finish))
        return out

    def _kick(self, k: int, now: float, back_to_back: bool = False) -> None:
        """Start the next iteration on instance ``k`` if it is idle and has work;
        an empty plan leaves it idle until the next event that reaches it. With an
        overhead profile, a batch that follows one that just ended (``back_to_back``)
        starts after a measured gap (``sim.overhead``); the plan is decided at ``now``."""
        if self.in_flight[k] is not None:
            return  # busy (under overlap its successor was decided when it started)
        if self.overlap:
            self._kick_overlap(k, now, back_to_back)
            return
        if not self.instances[k].has_work:
            return
        if self._steady_limit[k]:
            decode_times = self._decode_times[k]
            assert decode_times is not None
            steady = SteadyRun.begin(self.instances[k], self._steady_limit[k], now, decode_times)
            if steady is not None:
                self.in_flight[k], end = steady
                self.ends.push(end, k)
                return
        flight = self._launch(k, now, now, back_to_back)
        if flight is not None:
            self._start(k, flight)

    def _kick_overlap(self, k: int, now: float, back_to_back: bool) -> None:
        """Overlap: start the plan decided while the last batch ran (or decide one now),
        then decide its successor at once, ending when it will end."""
        flight = self.queued[k]
        if flight is None:
            if not self.instances[k].has_work:
                return
            flight = self._launch(k, now, now, back_to_back)
            if flight is None:
                return
        self.queued[k] = None
        self._start(k, flight)
        if self.instances[k].has_work:  # plan k+1 leaves while k runs, k applied
            self.queued[k] = self._launch(k, now, flight.end, True)

    def _launch(self, k: int, now: float, after: float, back_to_back: bool) -> Flight | None:
        """Instance ``k``'s plan decided at ``now``, launched to start at ``after`` (+ a
        gap) and timed by the ground truth; its offloads and drops carried out. ``None``
        (state reported, a policy's timer set) for an empty plan."""
        driver = self.drivers[k]
        plan, offloaded, dropped, wake_at = driver.decide(now)
        if offloaded or dropped:
            self.num_offloads += len(offloaded)
            for action in self.controller.on_scheduled(driver.instance.instance_id, offloaded,
                                                       dropped, now):
                self._carry_out(action, now)
        if plan is None:
            if wake_at is not None:
                self.ends.push_wake(wake_at, k)
            self._report_state(k, now)
            return None
        shape = plan.shape()
        start = after + self._gap(back_to_back)
        return driver.launch(plan, start, start + self._batch_time[k](shape), shape)

    def _gap(self, back_to_back: bool) -> float:
        """The executor's idle time before a batch (0 without a profile or after idle)."""
        return self.overhead.gap() if back_to_back and self.overhead is not None else 0.0

    def _start(self, k: int, flight: Flight) -> None:
        if self.plans is not None:
            self.plans.append((self.instances[k].instance_id, flight.start, flight.end,
                               flight.plan))
        self.in_flight[k] = flight
        self.batch_start[k] = flight.start
        self.ends.push(flight.end, k)

    def _settle(self, k: int, now: float) -> None:
        """Write instance ``k``'s steady run back into it; what it still runs is in flight
        (ending at ``now``: only ``_finish_batch`` settles a run with one in flight)."""
        run = self.in_flight[k]
        assert isinstance(run, SteadyRun)
        left = run.settle()
        self.in_flight[k] = None if left is None else Flight(left[0], run.start, now, left[1])
        self.batch_start[k] = run.start
        self.num_steady += run.started

    def _finish_steady(self, k: int, run: SteadyRun, now: float, until: float) -> None:
        """A steady iteration that ends no request ended: what ``_finish_batch`` does for
        it, without a plan. It has no first or last token, and the state report it would
        make repeats the last one (nothing waiting, no prefill, a ticket offered). The
        iterations after it that also end no request and end before any other event (the
        next arrival at ``until``, a batch end or report in the heap) end here too, one by
        one as the event loop would end them, without a round trip through the heap."""
        heap, observe = self.ends.heap, self.policy_perf.observe_decodes
        while True:
            observe(run.contexts, run.started - 1, now - run.start)
            self.num_iterations += 1
            self.kv_util_sum += (run.num_blocks - run.free) / run.num_blocks
            run.ends.append(now)
            end = run.next_end(now)
            if end is None:
                break
            # ties: a batch end before an arrival, after an earlier-pushed heap entry
            if run.started >= run.last or end > until or (heap and heap[0][0] <= end):
                self.ends.push(end, k)
                return
            now = end
            if self._clock:  # as ``_finish_batch`` does at each batch end
                self.policy_perf.advance(now)
        self._settle(k, now)  # KV is short for the next iteration: the policy decides it
        self._report_state(k, now)
        self._kick(k, now, back_to_back=True)

    def _finish_batch(self, k: int, now: float, until: float = math.inf) -> None:
        """The heap entry ``k`` at ``now``: a batch end, a policy's timer, or a report
        reaching the controller; ``until``: the next arrival's time."""
        if k < 0:  # not a batch: a report reaching the controller (``cfg.controller_lag``)
            tokens, (j, made, waiting, offers) = self._reports.pop(k)
            if tokens:
                self.controller.on_tokens(tokens)
            assert self.lag is not None
            if self.lag.newer(j, made):
                self.controller.on_instance_state(self.instances[j].instance_id, waiting, now,
                                                  offers_ticket=offers)
            return
        if self._clock:  # the perf model's refit clock, before any decision at ``now``
            self.policy_perf.advance(now)
        if k >= WAKE:  # a policy's timer: plan again if the instance is still idle
            if self.in_flight[k - WAKE] is None:
                self._kick(k - WAKE, now)
            return
        flight = self.in_flight[k]
        if isinstance(flight, SteadyRun):
            if flight.started < flight.last:
                self._finish_steady(k, flight, now, until)
                return
            self._settle(k, now)  # its last iteration ends a request: finished as any other
            flight = self.in_flight[k]
        assert flight is not None and not isinstance(flight, SteadyRun)
        shape = flight.shape
        assert shape is not None
        inst = self.instances[k]
        self.in_flight[k] = None
        duration = now - self.batch_start[k]
        self.policy_perf.observe_batch(shape, duration)
        if self.record_samples:
            self.samples.append(BatchSample(shape, duration))
            self.sample_times.append(self.batch_start[k])
        self.num_iterations += 1
        kv = inst.kv
        self.kv_util_sum += (kv.num_blocks - kv.num_free_blocks) / kv.num_blocks  # utilization
        tokens = self.drivers[k].land(flight, None)  # applied now, or at launch (overlap)
        if tokens and self.stream is not None:
            for t in tokens:
                if t.finished:
                    self._retire(t.request_id)
        self._report_state(k, now, tokens)
        self._kick(k, now, back_to_back=True)

    def _report_state(self, k: int, now: float, tokens: list[TokenEvent] | None = None) -> None:
        """Instance ``k``'s report to the controller: after a batch its ``tokens``, and its
        state; now, or after the lag (``cfg.controller_lag``)."""
        inst = self.instances[k]
        offers = not self._ticket_hook[k] or inst.policy.offers_ticket(inst.view(now))
        if self.lag is None:
            if tokens:
                self.controller.on_tokens(tokens)
            self.controller.on_instance_state(
                inst.instance_id, inst.num_waiting_prefills, now, offers_ticket=offers)
            return
        self._report_seq += 1
        key = -self._report_seq
        self._reports[key] = (tokens or [], (k, now, inst.num_waiting_prefills, offers))
        self.ends.push(self.lag.arrival(now), key)

    def totals(self, end: float) -> RunTotals:
        """What this run (or part) added up, steady runs cut short settled first."""
        for k, flight in enumerate(self.in_flight):
            if isinstance(flight, SteadyRun):  # a run cut short: its instance as it stands
                self._settle(k, end)
        return RunTotals(end, self.num_iterations, self.num_offloads, self.kv_util_sum,
                         sum(i.num_preemptions for i in self.instances),
                         prefix_counts(self.instances))

    def measured(self) -> RunSummary | list[Request]:
        """Its requests' measurements: the streaming summary with the unfinished folded in,
        or (exact mode) this run's requests in workload order."""
        if self.stream is None:
            return self._delivered(
                [r for r in self.workload.requests if r.request_id in self.requests])
        self.stream.add(self._delivered(self._retired + list(self.requests.values())))
        self._retired, self.requests = [], {}
        return self.stream

    def _summary(self, end: float, wall: float) -> dict[str, Any]:
        totals = self.totals(end)
        out = run_summary(self.cfg, self.measured(), totals, self.workload.num_too_long, wall)
        if (router := self.controller.prefix_router) is not None:
            out["prefix_routed_to_match"] = router.num_matched
        return out


def simulate(cfg: SimConfig) -> dict[str, Any]:
    """Run one simulation and return the metrics JSON object (docs/design.md definitions)."""
    if cfg.workers > 1:
        from sloserve.sim.parallel import simulate_parallel

        return simulate_parallel(cfg)
    return Simulation(cfg).run()
