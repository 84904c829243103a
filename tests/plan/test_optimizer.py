"""BestServe Optimizer (§3.5, Algorithms 8-9) and strategy enumeration."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.plan.accurate import policy_variants
from sloserve.plan.optimizer import Scenario, SearchConfig, get_goodput, plan_fast, slo_feasible
from sloserve.plan.strategies import (
    COLLOCATED,
    DISAGGREGATED,
    Strategy,
    enumerate_strategies,
    kv_slots,
)

A100 = get_hardware("a100")


def test_goodput_is_zero_when_the_pessimistic_rate_fails() -> None:
    calls: list[float] = []

    def feasible(lam: float) -> bool:
        calls.append(lam)
        return False

    assert get_goodput(feasible, t_min=2.0) == 0.0
    assert calls == [0.1]


def test_bisection_starts_at_paper_bounds_and_converges() -> None:
    calls: list[float] = []

    def feasible(lam: float) -> bool:
        calls.append(lam)
        return lam <= 0.37

    g = get_goodput(feasible, t_min=2.0, rel_tol=0.01)
    assert calls[:3] == [0.1, pytest.approx((0.1 + 0.6) / 2), pytest.approx((0.35 + 0.6) / 2)]
    assert 0.37 * 0.99 <= g <= 0.37


def test_paper_upper_bound_caps_goodput_at_1_2_over_t_min() -> None:
    calls: list[float] = []

    def feasible(lam: float) -> bool:
        calls.append(lam)
        return lam <= 5.0

    g = get_goodput(feasible, t_min=1.0, rel_tol=0.01)
    assert 1.2 * 0.99 <= g < 1.2
    assert max(calls) < 1.2  # λ_u itself is never checked, let alone exceeded


def test_paper_bound_below_the_pessimistic_rate_returns_it() -> None:
    calls: list[float] = []

    def feasible(lam: float) -> bool:
        calls.append(lam)
        return True

    assert get_goodput(feasible, t_min=20.0) == 0.1  # λ_u = 0.06 < λ_l: nothing to bisect
    assert calls == [0.1]
    assert get_goodput(feasible, t_min=20.0, extend_upper=True, max_doublings=2) == 0.4


def test_extended_upper_bound_is_doubled_while_feasible() -> None:
    g = get_goodput(lambda lam: lam <= 5.0, t_min=1.0, rel_tol=0.01, extend_upper=True)
    assert 5.0 * 0.99 <= g <= 5.0


def test_plan_fast_extension_only_raises_goodput_past_the_paper_bound() -> None:
    model = get_model("llama-2-7b")
    sc = Scenario.build(model, A100, 2.0, 0.1, [(512, 32)], num_requests=150)
    strategy = Strategy(COLLOCATED, 2, 1, 16)
    paper = plan_fast(sc, [strategy], SearchConfig(rel_tol=0.05))[0].goodput_rps
    ext = plan_fast(sc, [strategy], SearchConfig(rel_tol=0.05, extend_upper=True))[0]
    from sloserve.plan.optimizer import FastEvaluator

    bound = 1.2 / FastEvaluator(sc).t_min(strategy)
    assert 0 < paper < bound
    assert ext.goodput_rps > bound  # two batching instances serve more than one bare server


def test_seeds_average_the_p90s_of_reseeded_workloads() -> None:
    from sloserve.plan.optimizer import FastEvaluator

    model = get_model("llama-2-7b")
    sc = Scenario.build(model, A100, 2.0, 0.1, [(512, 32)], num_requests=150, seed=3)
    strategy = Strategy(COLLOCATED, 1, 1, 16)
    ev = FastEvaluator(sc, SearchConfig(seeds=3))
    assert [s.seed for s in ev.scenarios] == [3, 4, 5]
    assert not np.array_equal(ev.scenarios[0].unit_arrivals, ev.scenarios[1].unit_arrivals)
    runs = [ev.p90_one(s, strategy, 4.0) for s in ev.scenarios]
    assert len({r[0] for r in runs}) == 3  # three different workloads
    ttft, tpot = ev.p90(strategy, 4.0)
    assert ttft == pytest.approx(np.mean([r[0] for r in runs]))
    assert tpot == pytest.approx(np.mean([r[1] for r in runs]))
    one = FastEvaluator(sc).p90(strategy, 4.0)
    assert one == pytest.approx(runs[0])


def test_algorithm_9_relaxation() -> None:
    assert slo_feasible(1.1, 0.11, 1.0, 0.1)
    assert not slo_feasible(1.11, 0.05, 1.0, 0.1)
    assert not slo_feasible(0.5, 0.111, 1.0, 0.1)
    assert not slo_feasible(1.05, 0.1, 1.0, 0.1, relaxation=0.0)


def test_enumeration_covers_xm_and_ypzd_within_budget() -> None:
    strategies = enumerate_strategies(get_model("codellama-34b"), A100, 8, 2112)
    names = {s.name for s in strategies}
    assert len(strategies) == 50
    assert {"8m-tp1", "4m-tp2", "1m-tp8", "2p3d-tp1", "1p1d-tp4", "3p1d-tp2"} <= names
    assert "1p1d-tp8" not in names and "5p4d-tp1" not in names
    assert all(s.gpus <= 8 for s in strategies)


def test_strategies_whose_weights_do_not_fit_are_left_out() -> None:
    model = get_model("llama-2-70b")
    assert kv_slots(model, A100, 1, 1024) == 0
    assert all(s.tp >= 2 for s in enumerate_strategies(model, A100, 8, 1024))


def test_strategy_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="decode_instances"):
        Strategy(DISAGGREGATED, 2, 1, 32, policy="disagg")
    with pytest.raises(ValueError, match="policy"):
        Strategy(COLLOCATED, 2, 1, 32, policy="nope")


def test_policy_variants_extend_a_collocated_deployment() -> None:
    base = Strategy(COLLOCATED, 3, 2, 32)
    names = [v.name for v in policy_variants(base, ["vllm", "sarathi", "ascendra", "accelgen"],
                                             (512, 2048))]
    assert names == ["3m-tp2", "3m-tp2-sarathi512", "3m-tp2-sarathi2048",
                     "3m-tp2-ascendra-1hp", "3m-tp2-accelgen"]


def test_plan_ranks_by_goodput_per_gpu() -> None:
    model = get_model("llama-2-7b")
    sc = Scenario.build(model, A100, 2.0, 0.1, [(512, 32)], num_requests=150)
    strategies = [Strategy(COLLOCATED, m, 1, 16) for m in (1, 2)]
    res = plan_fast(sc, strategies, SearchConfig(rel_tol=0.05, extend_upper=True))
    per_gpu = [r.goodput_per_gpu for r in res]
    assert per_gpu == sorted(per_gpu, reverse=True) and per_gpu[0] > 0
    by_m = {r.strategy.instances: r.goodput_rps for r in res}
    assert by_m[2] > 1.5 * by_m[1]


def test_scenario_rejects_bad_slo() -> None:
    with pytest.raises(ValueError, match="tpot_slo"):
        Scenario.build(get_model("llama-2-7b"), A100, 1.0, 0.0, [(10, 10)], 10)
