"""Run-to-run noise of a measured batch time: mean-one lognormal with a given CV.

The factors are ``random.Random(seed).lognormvariate(mu, sigma)``, one per noisy
batch, in order. They are drawn ahead in blocks (``FactorStream``): numpy's MT19937
continues the very state of ``random.Random(seed)`` and yields the same uniforms, the
Kinderman-Monahan rejection of ``Random.normalvariate`` is applied to them in bulk,
and each factor is ``math.exp`` of the same float, so each factor is bit for bit the
one ``lognormvariate`` would return (tests/perf/test_noise_stream.py); the simulator
draws one per iteration, ~1 us each in pure Python.
"""

from __future__ import annotations

import math
import random
from itertools import chain

import numpy as np

from sloserve.defaults import NOISE_CV

BLOCK = 4096  # factors drawn ahead at a time
NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)  # random.NV_MAGICCONST
TIE = 1e-9  # accept tests this close (relative) are redone with math.log, as Python does


class FactorStream:
    """``lognormvariate(mu, sigma)`` of ``random.Random(seed)``, drawn ahead in blocks."""

    def __init__(self, seed: int | str, mu: float, sigma: float) -> None:
        self._mu, self._sigma = mu, sigma
        _, state, _ = random.Random(seed).getstate()
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937",
                            "state": {"key": np.array(state[:-1], dtype=np.uint32),
                                      "pos": state[-1]}}
        self._left = np.empty(0)  # uniforms drawn but not yet used (a pair's start)
        # every factor in order, block after block (C-level ``next``)
        self.draw = chain.from_iterable(iter(self._block, None)).__next__

    def _uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` values of ``Random.random()``: 53 bits from two 32-bit outputs."""
        raw = self._bits.random_raw(2 * n).reshape(n, 2)
        return ((raw[:, 0] >> 5).astype(np.float64) * 67108864.0
                + (raw[:, 1] >> 6).astype(np.float64)) / 9007199254740992.0

    def _block(self) -> list[float]:
        """The next factors (about ``BLOCK``): pairs of uniforms ``(u1, 1 - u2)``, each
        accepted or rejected in turn exactly as ``Random.normalvariate`` does; the pairs
        after the last accepted one start the next block."""
        u = np.concatenate([self._left, self._uniforms(2 * BLOCK)])
        u1, u2 = u[0::2], 1.0 - u[1::2]
        z = NV_MAGICCONST * (u1 - 0.5) / u2
        zz = z * z / 4.0
        bound = -np.log(u2)
        ok = zz <= bound
        for i in np.flatnonzero(np.abs(zz - bound) <= TIE * np.abs(bound)).tolist():
            ok[i] = zz[i] <= -math.log(u2[i])  # too close to trust numpy's log: Python's
        accepted = np.flatnonzero(ok)
        used = int(accepted[-1]) + 1 if accepted.size else 0  # pairs up to the last accepted
        self._left = u[2 * used:]
        return list(map(math.exp, (self._mu + z[accepted] * self._sigma).tolist()))


class RunToRunNoise:
    """Deterministic for a seed (an int, or a string such as ``stream_seed``'s: seeded as
    ``random.Random`` seeds it); ``cv = 0`` leaves times untouched."""

    def __init__(self, seed: int | str = 0, cv: float = NOISE_CV) -> None:
        if cv < 0:
            raise ValueError(f"noise_cv: must be >= 0, got {cv}")
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._mu = -0.5 * self._sigma * self._sigma  # E[exp(N(mu, sigma^2))] = 1
        self._draw = FactorStream(seed, self._mu, self._sigma).draw

    def apply(self, t: float) -> float:
        if self._sigma and t:
            return t * self._draw()
        return t


def stream_seed(seed: int, instance: int) -> str:
    """The seed of instance ``instance``'s own noise stream in a run seeded ``seed``
    (``SimConfig.noise_streams == "instance"``)."""
    return f"{seed}/instance/{instance}"


def parse_stream_seed(text: str) -> tuple[int, int] | None:
    """``(seed, instance)`` of a ``stream_seed`` string; None for anything else."""
    seed, sep, instance = text.partition("/instance/")
    try:
        return (int(seed), int(instance)) if sep else None
    except ValueError:
        return None
