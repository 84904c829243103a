"""Run-to-run noise of a measured batch time: mean-one lognormal with a given CV."""

from __future__ import annotations

import math
import random


class RunToRunNoise:
    """Deterministic for a seed; ``cv = 0`` leaves times untouched."""

    def __init__(self, seed: int = 0, cv: float = 0.03) -> None:
        if cv < 0:
            raise ValueError(f"noise_cv: must be >= 0, got {cv}")
        self._rng = random.Random(seed)
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._mu = -0.5 * self._sigma * self._sigma  # E[exp(N(mu, sigma^2))] = 1

    def apply(self, t: float) -> float:
        if self._sigma and t:
            return t * self._rng.lognormvariate(self._mu, self._sigma)
        return t
