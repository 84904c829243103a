"""BestServe's Optimizer (§3.5): bisect each strategy's goodput (Algorithm 8) on the P90
SLO check (Algorithm 9), and rank the strategies.

Arrivals use common random numbers: one unit-rate Poisson sequence per seed,
scaled by ``1 / λ``, so every feasibility check of every strategy sees the same
requests in the same order -- the check is deterministic and (nearly)
monotone in ``λ``, which is what a bisection needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sloserve.perf.hardware import Hardware
from sloserve.perf.models import ModelShape
from sloserve.plan.estimator import Estimator, EstimatorConfig
from sloserve.plan.fast_sim import (
    Requests,
    decode_time,
    kv_transfer_time,
    prefill_batch_time,
    simulate_collocated,
    simulate_disaggregated,
)
from sloserve.plan.strategies import DISAGGREGATED, Strategy, kv_slots
from sloserve.policies import BASELINE

RELAXATION = 0.1  # Algorithm 9's τ
LAMBDA_LO = 0.1  # Algorithm 8's pessimistic start, requests/s
UPPER_FACTOR = 1.2  # Algorithm 8: λ_u = 1.2 / T_min


@dataclass(frozen=True, slots=True)
class Scenario:
    """What the planner is asked about: model, hardware, request lengths, SLOs.

    ``prompt_lens``/``output_lens`` hold one sample per simulated request;
    ``unit_arrivals`` their arrival times at rate 1 (divide by ``λ``). ``trace`` or
    ``fixed_lengths`` says where the lengths came from (the accurate mode reuses it).
    """

    model: ModelShape
    hw: Hardware
    ttft_slo: float
    tpot_slo: float
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    unit_arrivals: np.ndarray
    trace: str | None = None
    trace_file: str | None = None
    fixed_lengths: tuple[int, int] | None = None
    seed: int = 0
    length_pool: np.ndarray | None = None  # (prompt, output) pairs the lengths were drawn from

    def __post_init__(self) -> None:
        if not self.ttft_slo > 0:
            raise ValueError(f"ttft_slo: must be > 0 seconds, got {self.ttft_slo}")
        if not self.tpot_slo > 0:
            raise ValueError(f"tpot_slo: must be > 0 seconds, got {self.tpot_slo}")

    @classmethod
    def build(cls, model: ModelShape, hw: Hardware, ttft_slo: float, tpot_slo: float,
              lengths: Sequence[tuple[int, int]], num_requests: int, seed: int = 0,
              trace: str | None = None, trace_file: str | None = None) -> Scenario:
        """``num_requests`` requests whose (prompt, output) lengths are drawn from
        ``lengths`` (all of them in order when there is one; else sampled, seeded)."""
        if num_requests < 1:
            raise ValueError(f"num_requests: must be >= 1, got {num_requests}")
        if not lengths:
            raise ValueError("lengths: need at least one (prompt, output) pair")
        pool = np.array(lengths, dtype=np.int64)
        pool = pool[(pool[:, 0] >= 1) & (pool[:, 1] >= 1)
                    & (pool.sum(axis=1) <= model.max_context)]
        if len(pool) == 0:
            raise ValueError(f"lengths: no request fits {model.name}'s {model.max_context}-token "
                             "context")
        return cls._draw(model, hw, ttft_slo, tpot_slo, pool, num_requests, seed, trace,
                         trace_file)

    @classmethod
    def _draw(cls, model: ModelShape, hw: Hardware, ttft_slo: float, tpot_slo: float,
              pool: np.ndarray, num_requests: int, seed: int, trace: str | None,
              trace_file: str | None) -> Scenario:
        rng = np.random.default_rng(seed)
        pick = pool[rng.integers(len(pool), size=num_requests)]
        unit = np.cumsum(rng.exponential(1.0, size=num_requests))
        single = len(pool) == 1 and trace is None and trace_file is None
        fixed = (int(pool[0, 0]), int(pool[0, 1])) if single else None
        return cls(model, hw, ttft_slo, tpot_slo, pick[:, 0].copy(), pick[:, 1].copy(), unit,
                   trace=trace, trace_file=trace_file, fixed_lengths=fixed, seed=seed,
                   length_pool=pool)

    def reseeded(self, seed: int) -> Scenario:
        """The same scenario with arrivals (and sampled lengths) drawn from ``seed``:
        one of Fig. 10b's repeated runs."""
        pool = self.length_pool
        if pool is None:
            pool = np.stack([self.prompt_lens, self.output_lens], axis=1)
        return Scenario._draw(self.model, self.hw, self.ttft_slo, self.tpot_slo, pool,
                              len(self.unit_arrivals), seed, self.trace, self.trace_file)

    def seed_scenarios(self, seeds: int) -> list[Scenario]:
        """This scenario and ``seeds - 1`` reseeded copies (seeds ``seed + 1``, ...)."""
        if seeds < 1:
            raise ValueError(f"seeds: must be >= 1, got {seeds}")
        return [self, *(self.reseeded(self.seed + k) for k in range(1, seeds))]

    def requests(self, lam: float) -> Requests:
        return Requests(self.unit_arrivals / lam, self.prompt_lens, self.output_lens)

    @property
    def mean_context(self) -> int:
        return int(np.ceil(float(np.mean(self.prompt_lens + self.output_lens))))


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """Knobs of the fast search (defaults: the paper's where it gives one)."""

    relaxation: float = RELAXATION
    lambda_lo: float = LAMBDA_LO
    upper_factor: float = UPPER_FACTOR
    rel_tol: float = 0.02  # stop when λ_u - λ_l <= rel_tol * λ_u (Alg. 8's ε, made relative)
    extend_upper: bool = False  # not in the paper: double λ_u while feasible (``get_goodput``)
    max_doublings: int = 10  # with ``extend_upper``: at most this many doublings
    seeds: int = 1  # Fig. 10b: P90s averaged over this many seeded workloads per check
    tau: float = 2.5  # pseudo batch size balance (eq. 9)
    max_batch_tokens: int = 8192  # vLLM's max_num_batched_tokens for prefill batches
    seq_cap: bool = False  # vLLM admission in the collocated simulator (fast_sim)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)


@dataclass(frozen=True, slots=True)
class StrategyResult:
    strategy: Strategy
    goodput_rps: float
    evaluations: int
    mode: str = "fast"

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.strategy.gpus


def slo_feasible(p90_ttft: float, p90_tpot: float, ttft_slo: float, tpot_slo: float,
                 relaxation: float = RELAXATION) -> bool:
    """Algorithm 9: P90 TTFT and P90 TPOT within ``(1 + τ)`` of their goals."""
    return p90_ttft <= (1 + relaxation) * ttft_slo and p90_tpot <= (1 + relaxation) * tpot_slo


def get_goodput(feasible: Callable[[float], bool], t_min: float, lambda_lo: float = LAMBDA_LO,
                upper_factor: float = UPPER_FACTOR, rel_tol: float = 0.02,
                extend_upper: bool = False, max_doublings: int = 10) -> float:
    """Algorithm 8: 0 if ``λ_l = 0.1`` fails, else bisect between ``λ_l`` and
    ``λ_u = 1.2 / T_min`` until ``λ_u - λ_l <= rel_tol * λ_u``; the answer never
    exceeds ``λ_u`` (the paper: ``1/T_min`` is the optimistic serving rate).

    When ``λ_u <= λ_l`` (``T_min >= 12 s``) there is nothing to bisect and the answer is
    ``λ_l``, as the printed algorithm returns. ``extend_upper=True`` (not in the paper;
    ``sloserve plan --extend-upper``): ``m`` batching instances can go past one unbatched
    server's rate, so ``λ_u`` (at least ``2 λ_l``) is doubled while it is itself feasible
    (at most ``max_doublings`` times) before bisecting.
    """
    if not t_min > 0:
        raise ValueError(f"t_min: must be > 0, got {t_min}")
    lo = lambda_lo
    if not feasible(lo):
        return 0.0
    hi = upper_factor / t_min
    if not extend_upper and hi <= lo:
        return lo
    if extend_upper:
        hi = max(hi, 2 * lo)
        for _ in range(max_doublings):
            if not feasible(hi):
                break
            lo, hi = hi, 2 * hi
        else:
            return lo
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return lo


class FastEvaluator:
    """BestServe's fast simulators behind one ``p90(strategy, λ)`` call; estimators cached."""

    def __init__(self, scenario: Scenario, config: SearchConfig | None = None) -> None:
        self.scenario = scenario
        self.config = config or SearchConfig()
        self.scenarios = scenario.seed_scenarios(self.config.seeds)
        self._estimators: dict[int, Estimator] = {}

    def estimator(self, tp: int) -> Estimator:
        if tp not in self._estimators:
            sc = self.scenario
            self._estimators[tp] = Estimator(sc.model, sc.hw, tp, self.config.estimator)
        return self._estimators[tp]

    def slots(self, strategy: Strategy) -> int:
        sc = self.scenario
        return max(1, min(strategy.max_batch_size,
                          kv_slots(sc.model, sc.hw, strategy.tp, sc.mean_context)))

    def t_min(self, strategy: Strategy) -> float:
        """Time to serve one request alone (Alg. 8's ``T_min``), at the mean lengths."""
        est = self.estimator(strategy.tp)
        s = int(round(float(np.mean(self.scenario.prompt_lens))))
        o = int(round(float(np.mean(self.scenario.output_lens))))
        t = prefill_batch_time(est, np.array([s])) + decode_time(est, 0, s, o, self.config.tau)
        if strategy.architecture == DISAGGREGATED:
            t += float(kv_transfer_time(est, np.array([s]))[0])
        return t

    def p90(self, strategy: Strategy, lam: float) -> tuple[float, float]:
        """P90 TTFT and TPOT, each averaged over the ``config.seeds`` workloads (Fig. 10b)."""
        return average_p90([self.p90_one(sc, strategy, lam) for sc in self.scenarios])

    def p90_one(self, scenario: Scenario, strategy: Strategy, lam: float) -> tuple[float, float]:
        cfg, est = self.config, self.estimator(strategy.tp)
        reqs = scenario.requests(lam)
        rng = np.random.default_rng(scenario.seed)
        if strategy.architecture == DISAGGREGATED:
            lat = simulate_disaggregated(est, est, reqs, strategy.instances,
                                         strategy.decode_instances, strategy.max_batch_size,
                                         self.slots(strategy), cfg.max_batch_tokens, rng, cfg.tau)
        else:
            if strategy.policy != BASELINE:
                raise ValueError(f"policy: the fast mode simulates vllm collocation only, not "
                                 f"{strategy.policy!r}; use the accurate mode")
            lat = simulate_collocated(est, reqs, strategy.instances, strategy.max_batch_size,
                                      self.slots(strategy), cfg.max_batch_tokens, rng, cfg.tau,
                                      cfg.seq_cap)
        ttft, tpot = lat.p90()
        return ttft, tpot


def average_p90(runs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Fig. 10b: the mean of each P90 over repeated runs (``inf`` if any run is infeasible)."""
    if not runs:
        raise ValueError("runs: need at least one (p90_ttft, p90_tpot)")
    return (float(np.mean([r[0] for r in runs])), float(np.mean([r[1] for r in runs])))


def evaluate(strategy: Strategy, p90: Callable[[Strategy, float], tuple[float, float]],
             t_min: float, scenario: Scenario, config: SearchConfig, mode: str) -> StrategyResult:
    """Algorithm 8 with Algorithm 9 as the check, counting simulator runs."""
    calls = 0

    def feasible(lam: float) -> bool:
        nonlocal calls
        calls += 1
        ttft, tpot = p90(strategy, lam)
        return slo_feasible(ttft, tpot, scenario.ttft_slo, scenario.tpot_slo, config.relaxation)

    goodput = get_goodput(feasible, t_min, config.lambda_lo, config.upper_factor,
                          config.rel_tol, config.extend_upper, config.max_doublings)
    return StrategyResult(strategy, goodput, calls, mode)


def rank(results: Sequence[StrategyResult], by: str = "per_gpu") -> list[StrategyResult]:
    """Best first: goodput per GPU (BestServe's normalised goodput, Fig. 11) or total
    goodput (``by="total"``); ties go to fewer GPUs, then the name."""
    if by not in ("per_gpu", "total"):
        raise ValueError(f"rank_by: must be 'per_gpu' or 'total', got {by!r}")

    def key(r: StrategyResult) -> tuple[float, float, int, str]:
        primary = r.goodput_per_gpu if by == "per_gpu" else r.goodput_rps
        return (-primary, -r.goodput_rps, r.strategy.gpus, r.strategy.name)

    return sorted(results, key=key)


def plan_fast(scenario: Scenario, strategies: Sequence[Strategy],
              config: SearchConfig | None = None, rank_by: str = "per_gpu"
              ) -> list[StrategyResult]:
    """Fast mode: every strategy through BestServe's simulators, ranked."""
    ev = FastEvaluator(scenario, config)
    results = [evaluate(s, ev.p90, ev.t_min(s), scenario, ev.config, "fast") for s in strategies]
    return rank(results, rank_by)
