"""Accurate P/D simulator (sloserve.plan.disagg_sim) and the accurate mode's disaggregated
strategies: per-iteration decode batches instead of BestServe's pseudo batch (eq. 9)."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.batch import BatchShape
from sloserve.perf.fixed import FixedTiming
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.plan.accurate import AccurateEvaluator
from sloserve.plan.disagg_sim import simulate_disaggregated_iterations
from sloserve.plan.estimator import BestServeTiming, Estimator
from sloserve.plan.fast_sim import Requests, simulate_disaggregated
from sloserve.plan.optimizer import Scenario, SearchConfig
from sloserve.plan.strategies import DISAGG, DISAGGREGATED, Strategy

ONE_SECOND = FixedTiming(1.0)


def _reqs(n: int, prompt: int = 10, output: int = 3) -> Requests:
    return Requests(np.zeros(n), np.full(n, prompt), np.full(n, output))


def _run(reqs: Requests, y: int = 1, z: int = 1, max_batch: int = 8, slots: int = 8,
         kv: float = 0.0, timing: object = ONE_SECOND) -> tuple[np.ndarray, np.ndarray]:
    lat = simulate_disaggregated_iterations(timing, timing, reqs, y, z, max_batch, slots,  # type: ignore[arg-type]
                                            8192, np.full(len(reqs), kv))
    return lat.ttft, lat.tpot


def test_one_prefill_batch_then_decodes_run_together_iteration_by_iteration() -> None:
    ttft, tpot = _run(_reqs(2))
    assert list(ttft) == [1.0, 1.0]  # one prefill batch of both prompts
    assert list(tpot) == [1.0, 1.0]  # two decode iterations, both requests in each


def test_decode_slots_make_later_requests_wait() -> None:
    _, tpot = _run(_reqs(2), slots=1)
    assert list(tpot) == [1.0, 2.0]  # the second starts decoding when the first has ended


def test_prefill_instances_take_requests_round_robin() -> None:
    assert list(_run(_reqs(2), y=2, max_batch=1)[0]) == [1.0, 1.0]
    assert list(_run(_reqs(2), y=1, max_batch=1)[0]) == [1.0, 2.0]


def test_kv_transfer_counts_in_tpot_not_ttft() -> None:
    ttft, tpot = _run(_reqs(1), kv=0.5)
    assert ttft[0] == 1.0 and tpot[0] == pytest.approx((2 + 0.5) / 2)


def test_each_decode_step_is_timed_on_its_real_batch() -> None:
    est = Estimator(get_model("llama-2-7b"), get_hardware("a100"), 1)
    timing = BestServeTiming(est)
    p, o = 512, 4
    ttft, tpot = _run(_reqs(2, p, o), timing=timing)
    steps = [est.batch_time(BatchShape(decodes=(p + j, p + j))) for j in range(o - 1)]
    assert tpot[0] == pytest.approx(sum(steps) / (o - 1))
    # BestServe's fast simulator times both at the pseudo batch size 1 (eq. 9) instead
    fast = simulate_disaggregated(est, est, _reqs(2, p, o), 1, 1, 8, 8, 8192,
                                  np.random.default_rng(0))
    alone = [est.batch_time(BatchShape(decodes=(p + j,))) for j in range(o - 1)]
    assert tpot[0] > sum(alone) / (o - 1)
    assert fast.tpot[0] < tpot[0]


def test_accurate_evaluator_searches_disaggregated_strategies() -> None:
    model, hw = get_model("llama-2-7b"), get_hardware("a100")
    sc = Scenario.build(model, hw, 2.0, 0.1, [(512, 32)], num_requests=60)
    ev = AccurateEvaluator(sc, SearchConfig(rel_tol=0.1), num_requests=60,
                           ground_truth="estimator")
    res = ev.evaluate(Strategy(DISAGGREGATED, 1, 1, 16, decode_instances=1, policy=DISAGG))
    assert res.mode == "accurate" and res.goodput_rps > 0 and res.evaluations >= 2


def test_accurate_mode_averages_p90s_over_seeds() -> None:
    model, hw = get_model("llama-2-7b"), get_hardware("a100")
    sc = Scenario.build(model, hw, 2.0, 0.1, [(512, 32)], num_requests=60, seed=7)
    ev = AccurateEvaluator(sc, SearchConfig(seeds=2), num_requests=60, ground_truth="estimator")
    strategy = Strategy(DISAGGREGATED, 1, 1, 16, decode_instances=1, policy=DISAGG)
    assert [s.seed for s in ev.fast.scenarios] == [7, 8]
    runs = [ev.p90_one(s, strategy, 3.0) for s in ev.fast.scenarios]
    assert runs[0] != runs[1]
    assert ev.p90(strategy, 3.0) == pytest.approx(tuple(np.mean(runs, axis=0)))
