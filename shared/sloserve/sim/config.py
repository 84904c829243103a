"""Simulation configuration: a ``Deployment`` plus a workload (a frozen, slotted dataclass)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sloserve.deployment import Deployment
from sloserve.perf.base import TimingSource
from sloserve.policies.base import PolicyConfig
from sloserve.policies.registry import check_deployment
from sloserve.sim.split import split_refusal


@dataclass(frozen=True, slots=True)
class SimConfig(Deployment):
    """A ``Deployment`` (``sloserve.deployment``: policy, instances, model, GPU, KV, prefix
    caching and routing, admission, overlap, refit clock, SLOs, noise) plus a workload and
    the simulator's own switches (issue 32, item 2)."""

    trace: str | None = "sharegpt"
    trace_file: str | None = None
    fixed_lengths: tuple[int, int] | None = None  # (prompt_len, output_len) for every request
    qps: float = 1.0
    num_requests: int = 1000
    slo_mix: str | None = None
    jct_share: float = 0.0  # offline requests with only a JCT SLO (hetero mix, AccelGen §4.3)
    arrival: str = "poisson"  # poisson | gamma | trace
    cv: float = 1.0  # gamma arrivals' coefficient of variation
    # trace rows: "random" | "ordered" (the trace's own order, sessions kept); None: ordered
    # for a trace with session or prefix identity, else random (``workload.generate``)
    sample: str | None = None
    # "run": every batch's noise from one stream, in global batch order (every figure so
    # far); "instance": each instance from its own stream (``perf.noise.stream_seed``), as
    # the live stack's sim executors draw it (``up``: executor k, ``--seed S --instance k``)
    noise_streams: str = "run"
    # the ground truth's seed (noise, profiling sweep); None: ``seed``. The live stack's is
    # ``up --seed``, which need not be the workload's ``bench --seed`` (``--compare-sim``)
    noise_seed: int | None = None
    # replayed arrivals: one offset (s) per generated request, in workload order, instead of
    # the arrival process's (``bench --compare-sim``: when the live gateway stamped each one)
    arrival_times: tuple[float, ...] | None = None
    timing: TimingSource | None = None  # ground-truth override (e.g. a measured CPU profile)
    timing_profile: str | None = None  # file of measured samples (``sloserve profile --out``)
    # the live stack's un-hidden gap between batches (``sim.overhead``; ``bench --overhead-out``)
    overhead_profile: str | None = None
    record_samples: bool = False  # keep every (shape, duration) for offline analysis
    record_decisions: bool = False  # keep the controller's actions and every plan (tests)
    # the live gateway's lag in handling an instance's report (tokens, state), from the
    # overhead profile's delivery samples: the controller sees first tokens (HP tickets
    # freed) and queue states that much later (``sim.overhead.ControllerLag``)
    controller_lag: bool = False
    # prefix caching names the blocks a request's answer fills too (vLLM's); False: only its
    # prompt's full blocks, as the live stack, whose prefix identity is the prompt's token ids
    # (``kv_prefix.PrefixCachingBlockManager``; ``bench --compare-sim`` sets it)
    prefix_cache_outputs: bool = True
    # "stream": constant memory per request, percentiles from a 0.1 % relative-error sketch
    # (sloserve.sketch); counts, shares and goodput stay exact. "exact": every value kept.
    metrics: str = "exact"
    # run the iterations a policy declared steady without asking it (``sim.steady``): the same
    # decisions, timings and summary; False asks the policy every iteration (tests compare)
    steady: bool = True
    # processes: the instances split into this many groups, merged (``sim.parallel``); only
    # where no instance's run depends on another's (``sim.split``), else refused
    workers: int = 1

    def validate(self) -> None:
        """Every field's rule, refused naming the field (and its flag) before anything runs."""
        check_deployment(self.policy, self.instances, self.hp_instances, self.policy_config)
        self._check_workload()
        self._check_perf_model()
        self._check_noise()
        if self.metrics not in ("exact", "stream"):
            raise ValueError(f"metrics (--metrics): must be 'exact' or 'stream', "
                             f"got {self.metrics!r}")
        if self.workers < 1:
            raise ValueError(f"workers (--workers): must be >= 1, got {self.workers}")
        if self.workers > 1 and (why := split_refusal(self)) is not None:
            raise ValueError(why)
        self.check()  # every Deployment field's own rule

    def _check_workload(self) -> None:
        if not self.qps > 0:
            raise ValueError(f"qps: must be > 0, got {self.qps}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests: must be >= 1, got {self.num_requests}")
        sources = [self.trace is not None, self.trace_file is not None,
                   self.fixed_lengths is not None]
        if sum(sources) != 1:
            raise ValueError("trace: give exactly one of trace, trace_file, fixed_lengths")
        if self.sample is not None and self.sample not in ("random", "ordered"):
            raise ValueError(f"sample (--sample): must be 'random' or 'ordered', "
                             f"got {self.sample!r}")
        if not 0.0 <= self.jct_share <= 1.0:
            raise ValueError(f"jct_share (--jct-share): must be in [0, 1], got {self.jct_share!r}")
        if self.jct_share and self.slo_mix != "hetero":
            raise ValueError("jct_share (--jct-share): offline JCT requests are part of the "
                             "heterogeneous mix; add --slo-mix hetero")
        if self.arrival_times is not None and not all(
                math.isfinite(t) and t >= 0 for t in self.arrival_times):
            raise ValueError("arrival_times: every offset must be a finite number >= 0")

    def _check_perf_model(self) -> None:
        if self.perf_model not in ("online", "roofline"):
            raise ValueError(f"perf_model: must be 'online' or 'roofline', got {self.perf_model!r}")
        if self.refit_interval is not None:
            if not (isinstance(self.refit_interval, int | float)
                    and math.isfinite(self.refit_interval) and self.refit_interval > 0):
                raise ValueError(f"refit_interval (--refit-interval): must be a number of "
                                 f"seconds > 0, got {self.refit_interval!r}")
            if self.perf_model != "online":
                raise ValueError("refit_interval (--refit-interval): the roofline perf model "
                                 "is frozen, it never refits")
        if self.controller_lag and self.overhead_profile is None:
            raise ValueError("controller_lag (--controller-lag): needs an overhead profile "
                             "with delivery samples (--overhead-profile)")

    def _check_noise(self) -> None:
        if self.noise_cv < 0:
            raise ValueError(f"noise_cv: must be >= 0, got {self.noise_cv}")
        if self.noise_streams not in ("run", "instance"):
            raise ValueError(f"noise_streams (--noise-streams): must be 'run' or 'instance', "
                             f"got {self.noise_streams!r}")
        if self.noise_seed is not None and (isinstance(self.noise_seed, bool)
                                            or not isinstance(self.noise_seed, int)):
            raise ValueError(f"noise_seed (--noise-seed): must be an integer, "
                             f"got {self.noise_seed!r}")

    @property
    def truth_seed(self) -> int:
        """The ground truth's seed: ``noise_seed``, else the run's ``seed``."""
        return self.seed if self.noise_seed is None else self.noise_seed

    def resolved_policy_config(self, slo_mix: str | None = None) -> PolicyConfig:
        """The policy's config with its SLO-dependent defaults (token budget) filled in,
        for this workload's SLO mix."""
        return Deployment.resolved_policy_config(self, slo_mix or self.slo_mix)
