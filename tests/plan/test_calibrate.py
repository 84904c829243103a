"""Estimator constants calibrated on the shipped GPU profiles (sloserve.plan.calibrate) and
the ``--hardware`` presets (sloserve.plan.presets)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.plan.calibrate import (
    DECODE_MAX_TOKENS,
    calibrate,
    mape,
    predict,
    profile_rows,
)
from sloserve.plan.estimator import Estimator, EstimatorConfig, accumulate
from sloserve.plan.presets import PAPER, PRESETS, get_preset, resolve_preset


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_gpu_presets_are_the_fit_of_the_shipped_profiles(gpu: str) -> None:
    fit, preset = calibrate(gpu), PRESETS[gpu]
    assert (fit.prefill.e_c, fit.prefill.e_m) == (preset.prefill.e_c, preset.prefill.e_m)
    assert (fit.decode.e_c, fit.decode.e_m) == (preset.decode.e_c, preset.decode.e_m)
    assert fit.dispatch == pytest.approx(
        (preset.dispatch_rmsnorm, preset.dispatch_attention, preset.dispatch_mlp), abs=1e-12)
    assert fit.mape_prefill < 15 and fit.mape_decode < 10  # reported in docs/bestserve.md


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_calibrated_constants_fit_the_profiles_better_than_the_910b3_ones(gpu: str) -> None:
    rows = profile_rows(gpu)
    dec = rows.subset(rows.tokens <= DECODE_MAX_TOKENS)
    cal, paper = PRESETS[gpu], PRESETS[PAPER]

    def dispatch(c: EstimatorConfig) -> tuple[float, float, float]:
        return (c.dispatch_rmsnorm, c.dispatch_attention, c.dispatch_mlp)

    assert mape(dec, cal.decode, dispatch(cal)) < 0.5 * mape(dec, paper.decode, dispatch(paper))


def test_predict_is_algorithm_1_over_the_profiled_ops() -> None:
    rows = profile_rows("a100")
    at = rows.subset(rows.tokens == 512)
    idx = at.labels.index(("llama-2-7b", 1))
    cfg = get_preset("a100")
    est = Estimator(get_model("llama-2-7b"), get_hardware("a100"), 1, cfg)
    want = accumulate(est.modules("prefill", 512.0, s2=0.0), 1)  # no score terms, TP 1
    got = predict(at, cfg.prefill, (cfg.dispatch_rmsnorm, cfg.dispatch_attention,
                                    cfg.dispatch_mlp))
    assert got[idx] == pytest.approx(want, rel=1e-9)


def test_tp8_decode_step_on_a100_is_no_longer_mostly_ascend_dispatch() -> None:
    """Issue 10 point 16: with 910B3 constants ~20 of a ~35 ms codellama-34b TP8 decode step
    was dispatch + all-reduce floor; the A100 calibration leaves a small share."""
    model, hw = get_model("codellama-34b"), get_hardware("a100")

    def step(cfg: EstimatorConfig) -> tuple[float, float]:
        est = Estimator(model, hw, 8, cfg)
        bare = Estimator(model, hw, 8, replace(cfg, dispatch_rmsnorm=0.0, dispatch_attention=0.0,
                                               dispatch_mlp=0.0, allreduce_floor=0.0))
        total = est.estimate_time(1, 2048, 64, "decode")
        return total, total - bare.estimate_time(1, 2048, 64, "decode")

    paper_total, paper_overhead = step(PRESETS[PAPER])
    cal_total, cal_overhead = step(PRESETS["a100"])
    assert paper_total == pytest.approx(0.035, rel=0.05)  # the figures
    assert paper_overhead == pytest.approx(0.020, rel=0.05)
    assert cal_overhead < 0.3 * paper_overhead and cal_total < 0.5 * paper_total


def test_unknown_or_uncalibrated_preset_names_the_field() -> None:
    with pytest.raises(ValueError, match="hardware: unknown preset 'tpu'"):
        resolve_preset("tpu", "a100")
    with pytest.raises(ValueError, match="hardware: no calibrated preset for gpu 'h200'"):
        resolve_preset("auto", "h200")
    assert resolve_preset("auto", "a100-80gb") == "a100"
    assert resolve_preset("Ascend-910B3", "h200") == PAPER
