"""Deferred perf-model observations give every prediction, and the final model, exactly."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.regression import AscendraRegression
from sloserve.sim.config import SimConfig
from sloserve.sim.deferred import DeferredObservations
from sloserve.sim.simulator import Simulation

PROBE = BatchShape(prefills=((256, 128),), decodes=(300, 700))


def _model(window: int, refit_every: int) -> AscendraRegression:
    return AscendraRegression(get_model("llama-3-8b"), get_hardware("a100"),
                              window=window, refit_every=refit_every)


def _sample(rng: random.Random) -> BatchSample:
    if rng.random() < 0.05:
        return BatchSample(BatchShape(), 0.0)  # ignored by the model: must not count
    decodes = tuple(rng.randrange(1, 4000) for _ in range(rng.randrange(0, 20)))
    prefills = ((rng.randrange(1, 512), rng.randrange(0, 2000)),) if rng.random() < 0.3 else ()
    if not decodes and not prefills:
        decodes = (10,)
    return BatchSample(BatchShape(prefills, decodes), rng.uniform(0.01, 0.08))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 12), st.integers(1, 6),
       st.lists(st.integers(0, 400), max_size=6))
def test_predictions_and_final_state_match_eager_observation(
        seed: int, window: int, refit_every: int, asks: list[int]) -> None:
    rng = random.Random(seed)
    eager, lazy_model = _model(window, refit_every), _model(window, refit_every)
    lazy = DeferredObservations(lazy_model)
    for k in range(400):
        s = _sample(rng)
        eager.observe(s)
        if k % 2:  # the simulator's form: the sample built only when it is applied
            lazy.observe_batch(s.shape, s.duration)
        else:
            lazy.observe(s)
        if k in asks:
            assert lazy.predict(PROBE) == eager.predict(PROBE)
    lazy.flush()
    assert lazy_model.coefficients == eager.coefficients
    assert lazy_model.num_samples == eager.num_samples
    assert lazy.predict(PROBE) == eager.predict(PROBE)


def test_a_long_sarathi_run_leaves_the_model_as_eager_observation_would() -> None:
    cfg = SimConfig(policy="sarathi", trace="sharegpt", qps=1.0, num_requests=300,
                    ttft_slo=1.0, tbt_slo=0.15, seed=1, record_samples=True)
    sim = Simulation(cfg)
    out = sim.run()
    assert out["iterations"] > sim.perf_model.window + 4 * sim.perf_model.refit_every
    replay = Simulation(dataclasses.replace(cfg, num_requests=1)).perf_model  # fitted, fresh
    for s in sim.samples:
        replay.observe(s)
    assert sim.perf_model.coefficients == replay.coefficients
