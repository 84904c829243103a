"""Arrival processes: Poisson, Gamma (bursty, given CV) and a trace's own timestamps.

All return non-decreasing ``float64`` arrays in seconds with the first request at
0 (the same origin the trace loader re-bases to). Capacity searches in
Sarathi-Serve §5.1 and BestServe use Poisson arrivals; Gamma with ``cv > 1``
models the burstiness of production traces (Azure code: CV ≈ 13).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _check(n: int, qps: float) -> None:
    if n < 1:
        raise ValueError(f"num_requests (--num-requests): must be >= 1, got {n}")
    if not (math.isfinite(qps) and qps > 0):
        raise ValueError(f"qps (--qps): must be a positive number of requests/s, got {qps!r}")


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(gaps[:-1])))


def poisson_arrivals(n: int, qps: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrivals of a Poisson process of rate ``qps`` (exponential gaps)."""
    _check(n, qps)
    return _from_gaps(rng.exponential(1.0 / qps, size=n))


def gamma_arrivals(n: int, qps: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrivals with Gamma gaps of mean ``1/qps`` and coefficient of variation ``cv``.

    Shape ``k = 1/cv²``, scale ``1/(qps·k)``; ``cv = 1`` is the Poisson process.
    """
    _check(n, qps)
    if not (math.isfinite(cv) and cv > 0):
        raise ValueError(f"cv (--cv): must be a positive coefficient of variation, got {cv!r}")
    shape = 1.0 / cv**2
    return _from_gaps(rng.gamma(shape, 1.0 / (qps * shape), size=n))


def trace_arrivals(times: Sequence[float], qps: float | None = None) -> np.ndarray:
    """A trace's own arrivals, re-based to 0; with ``qps`` time is scaled so the
    mean rate ``(n-1)/span`` equals ``qps`` (burstiness, i.e. the CV, is kept)."""
    t = np.sort(np.asarray(times, dtype=np.float64))
    if t.size == 0:
        raise ValueError("arrival times: need at least one")
    t -= t[0]
    if qps is None:
        return t
    _check(t.size, qps)
    span = float(t[-1])
    if t.size < 2 or span <= 0:
        raise ValueError("qps (--qps): cannot rescale trace arrivals that span no time")
    return t * ((t.size - 1) / span / qps)
