"""Accurate mode: the same Algorithm 8/9 search, but every feasibility check runs our
per-iteration discrete-event simulator (``sloserve.sim``) with a real policy.

What differs from the fast mode is the *scheduling* simulation: token-level
continuous batching, KV blocks and preemption, chunked prefills, the policy's
own decisions -- instead of BestServe's per-request pseudo batch size (eq. 9).
The *cost model* is the same BestServe Estimator whenever the model/GPU has no
real profile (``timing_source``), so fast-versus-accurate gaps measure the
fast simulators' approximations only. Disaggregated strategies run the
per-iteration P/D simulator of ``sloserve.plan.disagg_sim`` on the same cost
model (``sloserve.sim`` has no prefill/decode split). ``SearchConfig.seeds > 1``
averages each P90 over that many seeded workloads (Fig. 10b), as the fast mode does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sloserve.defaults import STRICT_TOKEN_BUDGET
from sloserve.perf.base import TimingSource
from sloserve.perf.profiles import available_profiles
from sloserve.plan.disagg_sim import simulate_disaggregated_iterations
from sloserve.plan.estimator import BestServeTiming, Estimator
from sloserve.plan.fast_sim import kv_transfer_time
from sloserve.plan.optimizer import (
    FastEvaluator,
    Scenario,
    SearchConfig,
    StrategyResult,
    average_p90,
    evaluate,
)
from sloserve.plan.strategies import COLLOCATED, Strategy
from sloserve.policies import PolicyConfig, get_spec


def timing_source(scenario: Scenario, tp: int, config: SearchConfig,
                  ground_truth: str = "auto") -> TimingSource | None:
    """``None`` (the simulator's real-profile ground truth) when ``ground_truth="auto"``
    and a profile exists for this model/GPU at TP 1; the BestServe Estimator otherwise."""
    if ground_truth not in ("auto", "estimator"):
        raise ValueError(f"ground_truth: must be 'auto' or 'estimator', got {ground_truth!r}")
    key = (scenario.model.name, scenario.hw.name)
    if ground_truth == "auto" and tp == 1 and key in available_profiles():
        return None
    return BestServeTiming(Estimator(scenario.model, scenario.hw, tp, config.estimator))


def policy_variants(base: Strategy, policies: Iterable[str],
                    token_budgets: Sequence[int] = (512, 2048)) -> list[Strategy]:
    """Our policies as strategy dimensions on one collocated ``xm`` deployment: once per
    token budget where the policy sweeps it (sarathi), with one of the ``m`` instances
    as HP where the policy has that role (ascendra, ``m >= 2``)."""
    if base.architecture != COLLOCATED:
        raise ValueError("strategy: policies apply to collocated strategies only")
    out: list[Strategy] = []
    for policy in policies:
        spec = get_spec(policy)
        if "token_budget" in spec.sweep:
            out += [replace(base, policy=policy, token_budget=b) for b in token_budgets]
        elif spec.has_role("hp"):
            if base.instances >= 2:
                out.append(replace(base, policy=policy, hp_instances=1))
        else:
            out.append(replace(base, policy=policy))
    return out


class AccurateEvaluator:
    """``p90(strategy, λ)`` from ``sloserve.sim.simulate`` (P90 TTFT, P90 per-request mean TBT)."""

    def __init__(self, scenario: Scenario, config: SearchConfig | None = None,
                 num_requests: int = 200, ground_truth: str = "auto",
                 policy_configs: Mapping[str, PolicyConfig] | None = None) -> None:
        if num_requests < 1:
            raise ValueError(f"num_requests: must be >= 1, got {num_requests}")
        self.scenario = scenario
        self.config = config or SearchConfig()
        self.num_requests = num_requests
        self.ground_truth = ground_truth
        self.policy_configs = dict(policy_configs or {})  # policy name -> its other knobs
        self.fast = FastEvaluator(scenario, self.config)
        self._timing: dict[int, TimingSource | None] = {}

    def timing(self, tp: int) -> TimingSource | None:
        if tp not in self._timing:
            self._timing[tp] = timing_source(self.scenario, tp, self.config, self.ground_truth)
        return self._timing[tp]

    def timing_name(self, tp: int) -> str:
        return "real-profile" if self.timing(tp) is None else "bestserve-estimator"

    def p90(self, strategy: Strategy, lam: float) -> tuple[float, float]:
        """P90 TTFT and TPOT, each averaged over the ``config.seeds`` workloads (Fig. 10b)."""
        return average_p90([self.p90_one(sc, strategy, lam) for sc in self.fast.scenarios])

    def p90_one(self, sc: Scenario, strategy: Strategy, lam: float) -> tuple[float, float]:
        from sloserve.sim.config import SimConfig
        from sloserve.sim.simulator import simulate

        if strategy.architecture != COLLOCATED:
            return self._p90_disaggregated(sc, strategy, lam)
        cfg = SimConfig(
            policy=strategy.policy, model=sc.model.name, gpu=sc.hw.name,
            instances=strategy.instances, hp_instances=strategy.hp_instances, tp=strategy.tp,
            trace=sc.trace if sc.fixed_lengths is None else None, trace_file=sc.trace_file,
            fixed_lengths=sc.fixed_lengths, qps=lam, num_requests=self.num_requests,
            ttft_slo=sc.ttft_slo, tbt_slo=sc.tpot_slo, seed=sc.seed,
            timing=self.timing(strategy.tp),
            policy_config=self.policy_config(strategy),
        )
        out = simulate(cfg)
        ttft, tpot = out.get("ttft_p90"), out.get("mean_tbt_p90")
        return (float("inf") if ttft is None else float(ttft),
                float("inf") if tpot is None else float(tpot))

    def _p90_disaggregated(self, sc: Scenario, strategy: Strategy, lam: float
                           ) -> tuple[float, float]:
        """The first ``num_requests`` of the scenario through ``disagg_sim``."""
        timing = self.timing(strategy.tp)
        if timing is None:  # the real profile the collocated simulator would use
            from sloserve.perf.ground_truth import ProfileTiming

            timing = ProfileTiming(sc.model.name, sc.hw.name, seed=sc.seed, tp=strategy.tp)
        reqs = sc.requests(lam)
        n = min(self.num_requests, len(reqs))
        reqs = type(reqs)(reqs.arrivals[:n], reqs.prompt_lens[:n], reqs.output_lens[:n])
        kv = kv_transfer_time(self.fast.estimator(strategy.tp), reqs.prompt_lens)
        lat = simulate_disaggregated_iterations(
            timing, timing, reqs, strategy.instances, strategy.decode_instances,
            strategy.max_batch_size, self.fast.slots(strategy), self.config.max_batch_tokens, kv)
        return lat.p90()

    def policy_config(self, strategy: Strategy) -> PolicyConfig:
        """The policy's config (``policy_configs``, else its defaults) with the strategy's
        batch limits as the knobs it has (the token budget 512 unless the strategy names one)."""
        spec = get_spec(strategy.policy)
        base = self.policy_configs.get(strategy.policy) or spec.config_cls()
        names = spec.knobs()
        knobs: dict[str, Any] = {"max_num_seqs": strategy.max_batch_size}
        if "token_budget" in names:
            knobs["token_budget"] = strategy.token_budget or STRICT_TOKEN_BUDGET
        if "max_num_batched_tokens" in names:
            knobs["max_num_batched_tokens"] = self.config.max_batch_tokens
        return replace(base, **knobs)

    def evaluate(self, strategy: Strategy) -> StrategyResult:
        return evaluate(strategy, self.p90, self.fast.t_min(strategy), self.scenario,
                        self.config, "accurate")


def plan_accurate(fast_results: Sequence[StrategyResult], evaluator: AccurateEvaluator,
                  top: int = 5, policies: Iterable[str] = ("vllm",),
                  token_budgets: Sequence[int] = (512, 2048)) -> list[StrategyResult]:
    """Re-evaluate the ``top`` best strategies of a fast plan (ranked ``fast_results``):
    each collocated one under each policy variant in the per-iteration simulator, each
    disaggregated one in the per-iteration P/D simulator."""
    if top < 1:
        raise ValueError(f"top: must be >= 1, got {top}")
    out: list[StrategyResult] = []
    for r in fast_results[:top]:
        b = r.strategy
        variants = ([b] if b.architecture != COLLOCATED
                    else policy_variants(b, policies, token_budgets))
        out += [evaluator.evaluate(v) for v in variants]
    return out
