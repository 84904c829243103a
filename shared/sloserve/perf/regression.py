"""Ascendra's batch-time regression (§3.3, eq. 4-5), refit online from batch samples.

``t = C1 (tM + tF) + C2 max(tM, tF) + C3 tM + C4 tF + C5`` with
``tM = M / M_H`` and ``tF = F / F_H`` from ``sloserve.perf.analytic``.

* Fit: least squares on *relative* error (each row weighted by 1/t), because
  the target is MAPE and batch times span 100x (a 10 ms decode and a 1 s
  prefill would otherwise be fitted on the prefill's absolute error alone).
* The five terms are collinear (tM + tF = tM + tF): only C1+C3, C1+C4, C2
  and C5 are identified. ``numpy.linalg.lstsq`` returns the minimum-norm
  coefficients, which give the same predictions as any other solution.
* Before any fit, C = (0, 1, 0, 0, 0): the plain roofline ``max(tM, tF)``,
  an optimistic lower bound that is sane in shape (monotone in work).
* Online: ``observe`` keeps a sliding window of the last ``window`` samples
  and refits every ``refit_every`` observations (once at least 5 are held).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.analytic import AnalyticCost
from sloserve.perf.hardware import Hardware
from sloserve.perf.models import ModelShape

ROOFLINE_COEFFICIENTS: tuple[float, ...] = (0.0, 1.0, 0.0, 0.0, 0.0)
_MIN_SAMPLES = 5


class AscendraRegression:
    """``OnlinePerfModel``: eq. 4-5 over the analytic (tM, tF) of a batch."""

    def __init__(
        self,
        model: ModelShape,
        hw: Hardware,
        tp: int = 1,
        window: int = 4096,
        refit_every: int = 64,
    ) -> None:
        if window < _MIN_SAMPLES:
            raise ValueError(f"window: must be >= {_MIN_SAMPLES}, got {window}")
        if refit_every < 1:
            raise ValueError(f"refit_every: must be >= 1, got {refit_every}")
        self.model, self.hw, self.tp = model, hw, tp
        self.refit_every = refit_every
        self._cost = AnalyticCost.of(model, tp)
        self._inv_mh = 1.0 / hw.mem_bandwidth
        self._inv_fh = 1.0 / hw.peak_flops
        self._rows: deque[tuple[float, float, float]] = deque(maxlen=window)  # (tM, tF, t)
        self._since_refit = 0
        self._c: tuple[float, ...] = ROOFLINE_COEFFICIENTS
        self._fold()

    @classmethod
    def from_coefficients(
        cls,
        model: ModelShape,
        hw: Hardware,
        coefficients: Sequence[float],
        tp: int = 1,
        window: int = 4096,
        refit_every: int = 64,
    ) -> AscendraRegression:
        reg = cls(model, hw, tp, window, refit_every)
        reg.set_coefficients(coefficients)
        return reg

    @property
    def coefficients(self) -> tuple[float, ...]:
        """(C1, C2, C3, C4, C5), seconds per roofline-second (C5: seconds)."""
        return self._c

    @property
    def window(self) -> int:
        """Samples the sliding window holds at most."""
        return self._rows.maxlen or 0

    @property
    def num_samples(self) -> int:
        """Samples currently in the sliding window."""
        return len(self._rows)

    def set_coefficients(self, coefficients: Sequence[float]) -> None:
        c = tuple(float(x) for x in coefficients)
        if len(c) != 5 or not all(math.isfinite(x) for x in c):
            raise ValueError(f"coefficients: need 5 finite numbers (C1..C5), got {coefficients!r}")
        self._c = c
        self._fold()

    def _fold(self) -> None:
        c1, c2, c3, c4, c5 = self._c
        self._a_m, self._a_f, self._a_max, self._a0 = c1 + c3, c1 + c4, c2, c5

    def roofline(self, shape: BatchShape) -> tuple[float, float]:
        """(tM, tF) of ``shape`` in seconds."""
        f, m = self._cost.flops_bytes(shape)
        return m * self._inv_mh, f * self._inv_fh

    def predict(self, shape: BatchShape) -> float:
        """Predicted iteration time in seconds (0 for an empty batch, never negative)."""
        if not shape.prefills and not shape.decodes:
            return 0.0
        f, m = self._cost.flops_bytes(shape)
        tm, tf = m * self._inv_mh, f * self._inv_fh
        t = self._a_m * tm + self._a_f * tf + self._a_max * (tm if tm > tf else tf) + self._a0
        return t if t > 0.0 else 0.0

    def observe(self, sample: BatchSample) -> None:
        """Add a measured batch to the window; refit every ``refit_every`` observations."""
        if sample.shape.is_empty or not sample.duration > 0.0:
            return  # nothing ran, or a non-positive time carries no information
        self._rows.append((*self.roofline(sample.shape), sample.duration))
        self._since_refit += 1
        if self._since_refit >= self.refit_every:
            self.refit()

    def fit(self, samples: Iterable[BatchSample]) -> None:
        """Replace the window with ``samples`` (the last ``window`` of them) and refit."""
        self._rows.clear()
        for s in samples:
            if not s.shape.is_empty and s.duration > 0.0:
                self._rows.append((*self.roofline(s.shape), s.duration))
        self.refit()

    def refit(self) -> None:
        """Weighted least squares over the window; keeps the old fit below 5 samples."""
        self._since_refit = 0
        if len(self._rows) < _MIN_SAMPLES:
            return
        rows = np.fromiter(  # = np.asarray(self._rows), twice as fast
            chain.from_iterable(self._rows), np.float64, 3 * len(self._rows)).reshape(-1, 3)
        tm, tf, t = rows[:, 0], rows[:, 1], rows[:, 2]
        x = np.column_stack([tm + tf, np.maximum(tm, tf), tm, tf, np.ones_like(t)])
        w = 1.0 / t
        coef, *_ = np.linalg.lstsq(x * w[:, None], t * w, rcond=None)
        self.set_coefficients(coef.tolist())

    def mape(self, samples: Iterable[BatchSample]) -> float:
        """Mean absolute percentage error (as a fraction) over samples with positive time."""
        errs = [
            abs(self.predict(s.shape) - s.duration) / s.duration for s in samples if s.duration > 0
        ]
        if not errs:
            raise ValueError("samples: need at least one sample with a positive duration")
        return sum(errs) / len(errs)
