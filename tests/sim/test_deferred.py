"""Deferred perf-model observations give every prediction, and the final model, exactly."""

from __future__ import annotations

import dataclasses
import random

import pytest
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


def _clock_reference(ref: AscendraRegression, interval: float,
                     events: list[tuple[float, BatchSample]], now: float) -> AscendraRegression:
    """The live perf-model service's rule, written plainly, on ``ref``: at every grid point
    ``j * interval`` passed (up to ``now``) with fresh samples, a refit over what came
    before it."""
    wake, fresh = 0.0, 0
    for t, s in [*events, (now, None)]:
        if t >= wake:
            if fresh:
                ref.refit()
                fresh = 0
            wake = (int(t / interval) + 1) * interval
        if s is not None:
            ref.observe(s)
            fresh += 1 if not s.shape.is_empty and s.duration > 0 else 0
    return ref


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 12), st.sampled_from([0.05, 0.2, 1.0]),
       st.lists(st.integers(0, 400), max_size=6))
def test_clock_refits_match_refitting_at_every_grid_point(
        seed: int, window: int, interval: float, asks: list[int]) -> None:
    rng = random.Random(seed)
    events, t = [], 0.0
    for _ in range(400):
        t += rng.choice([0.0, rng.expovariate(20.0)])  # some events at the same time
        events.append((t, _sample(rng)))
    lazy_model = _model(window, 64)
    lazy = DeferredObservations(lazy_model, refit_interval=interval)
    for k, (now, s) in enumerate(events):
        lazy.advance(now)
        if k in asks:  # a prediction at ``now`` sees the refits of grid points up to it
            ref = _clock_reference(_model(window, 1 << 62), interval, events[:k], now)
            assert lazy.predict(PROBE) == ref.predict(PROBE)
        lazy.observe_batch(s.shape, s.duration)
    lazy.flush()
    ref = _clock_reference(_model(window, 1 << 62), interval, events, events[-1][0])
    assert lazy_model.coefficients == ref.coefficients
    assert lazy_model.num_samples == ref.num_samples


def test_a_clock_refit_run_leaves_the_model_as_refits_at_each_grid_point_would() -> None:
    interval = 0.5
    cfg = SimConfig(policy="ascendra", instances=3, hp_instances=1, trace="sharegpt",
                    qps=6.0, num_requests=300, seed=1, record_samples=True,
                    refit_interval=interval)
    sim = Simulation(cfg)
    out = sim.run()
    assert out["iterations"] > sim.perf_model.window  # old samples were dropped on the way
    # in the order observed (batch ends), each at its end time
    events = [(start + s.duration, s) for start, s in zip(sim.sample_times, sim.samples,
                                                          strict=True)]
    assert events[-1][0] > 20 * interval  # many refits
    fresh_model = Simulation(dataclasses.replace(cfg, num_requests=1)).perf_model  # fitted
    fresh_model.refit_every = 1 << 62  # refit only when the clock says
    replay = _clock_reference(fresh_model, interval, events, events[-1][0])
    assert sim.perf_model.coefficients == replay.coefficients


def test_the_refit_cadence_changes_what_ascendra_decides_and_runs_repeat() -> None:
    cfg = SimConfig(policy="ascendra", instances=3, hp_instances=1, trace="sharegpt",
                    qps=8.5, num_requests=300, seed=4)
    by_count = Simulation(cfg).run()
    on_clock = Simulation(dataclasses.replace(cfg, refit_interval=0.25)).run()
    again = Simulation(dataclasses.replace(cfg, refit_interval=0.25)).run()
    assert on_clock["ttft_p99"] == again["ttft_p99"]
    assert on_clock["iterations"] == again["iterations"]
    assert (on_clock["ttft_p99"], on_clock["offloads"]) != (
        by_count["ttft_p99"], by_count["offloads"])


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "1"])
def test_a_bad_refit_interval_is_refused_naming_the_flag(bad: object) -> None:
    cfg = SimConfig(policy="sarathi", refit_interval=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"refit_interval \(--refit-interval\)"):
        cfg.validate()


def test_a_frozen_roofline_model_refuses_a_refit_interval() -> None:
    cfg = SimConfig(policy="sarathi", perf_model="roofline", refit_interval=1.0)
    with pytest.raises(ValueError, match=r"refit_interval \(--refit-interval\).*never refits"):
        cfg.validate()
