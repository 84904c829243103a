from __future__ import annotations

import random

import pytest

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.base import OnlinePerfModel
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.regression import AscendraRegression

MODEL, HW = get_model("llama-3-8b"), get_hardware("a100")
TRUE_C = (0.3, 0.9, 0.2, 0.5, 0.004)


def _shapes(n: int, seed: int) -> list[BatchShape]:
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < n:
        prefills = ((rng.randint(1, 2048), rng.randint(0, 2048)),) if rng.random() < 0.6 else ()
        decodes = tuple(rng.randint(1, 4000) for _ in range(rng.choice((0, 1, 8, 64))))
        if prefills or decodes:
            shapes.append(BatchShape(prefills=prefills, decodes=decodes))
    return shapes


def _formula(c: tuple[float, ...], tm: float, tf: float) -> float:
    return c[0] * (tm + tf) + c[1] * max(tm, tf) + c[2] * tm + c[3] * tf + c[4]


def _samples(c: tuple[float, ...], n: int, seed: int) -> list[BatchSample]:
    probe = AscendraRegression(MODEL, HW)
    return [BatchSample(s, _formula(c, *probe.roofline(s))) for s in _shapes(n, seed)]


def test_unfitted_model_predicts_the_plain_roofline() -> None:
    reg = AscendraRegression(MODEL, HW)
    assert isinstance(reg, OnlinePerfModel)
    shape = BatchShape(prefills=((512, 0),), decodes=(100,))
    assert reg.coefficients == (0.0, 1.0, 0.0, 0.0, 0.0)
    assert reg.predict(shape) == pytest.approx(max(reg.roofline(shape)))
    assert reg.predict(BatchShape()) == 0.0


def test_fit_recovers_identifiable_coefficients_and_predictions() -> None:
    reg = AscendraRegression(MODEL, HW)
    reg.fit(_samples(TRUE_C, 300, seed=1))
    c1, c2, c3, c4, c5 = reg.coefficients
    # tM + tF is collinear with tM and tF: C1+C3, C1+C4, C2, C5 are what is identified
    assert (c1 + c3, c1 + c4, c2, c5) == pytest.approx(
        (TRUE_C[0] + TRUE_C[2], TRUE_C[0] + TRUE_C[3], TRUE_C[1], TRUE_C[4]), rel=1e-6
    )
    assert reg.mape(_samples(TRUE_C, 200, seed=2)) < 1e-9


def test_online_refit_tracks_a_change_within_the_sliding_window() -> None:
    reg = AscendraRegression(MODEL, HW, window=128, refit_every=32)
    reg.fit(_samples(TRUE_C, 128, seed=3))
    slower = tuple(2 * x for x in TRUE_C)
    new = _samples(slower, 128, seed=4)
    for s in new[:31]:
        reg.observe(s)
    assert reg.mape(new) > 0.3  # not refit yet: 31 < refit_every
    for s in new[31:]:
        reg.observe(s)
    assert reg.num_samples == 128  # the window dropped the old samples
    assert reg.mape(new) < 1e-9


def test_set_coefficients_validates_and_round_trips() -> None:
    reg = AscendraRegression.from_coefficients(MODEL, HW, TRUE_C)
    assert reg.coefficients == TRUE_C
    with pytest.raises(ValueError, match="coefficients"):
        reg.set_coefficients((1.0, 2.0))
    with pytest.raises(ValueError, match="coefficients"):
        reg.set_coefficients((1.0, 2.0, 3.0, 4.0, float("nan")))
    assert reg.coefficients == TRUE_C
