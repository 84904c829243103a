"""Noise factors drawn ahead in blocks are bit for bit ``Random.lognormvariate``'s."""

from __future__ import annotations

import math
import random

import pytest

import sloserve.perf.noise as noise
from sloserve.perf.noise import FactorStream, RunToRunNoise


def _params(cv: float) -> tuple[float, float]:
    sigma = math.sqrt(math.log1p(cv * cv))
    return -0.5 * sigma * sigma, sigma


@pytest.mark.parametrize("seed", [0, 1, 5, -3, 2**40 + 7])
@pytest.mark.parametrize("cv", [0.03, 0.5, 2.0])
def test_the_stream_is_random_lognormvariate(seed: int, cv: float) -> None:
    mu, sigma = _params(cv)
    rng, stream = random.Random(seed), FactorStream(seed, mu, sigma)
    n = 3 * noise.BLOCK + 17  # across blocks
    assert [stream.draw() for _ in range(n)] == [rng.lognormvariate(mu, sigma) for _ in range(n)]


def test_accept_tests_redone_with_math_log_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noise, "TIE", 1.0)  # every accept test through math.log
    monkeypatch.setattr(noise, "BLOCK", 64)
    mu, sigma = _params(0.03)
    rng, stream = random.Random(9), FactorStream(9, mu, sigma)
    assert [stream.draw() for _ in range(500)] == [rng.lognormvariate(mu, sigma)
                                                  for _ in range(500)]


def test_noise_applies_the_stream_and_leaves_zero_and_noiseless_times() -> None:
    mu, sigma = _params(0.03)
    rng = random.Random(4)
    n = RunToRunNoise(4, 0.03)
    assert n.apply(0.0) == 0.0  # no draw
    assert [n.apply(0.02) for _ in range(100)] == [0.02 * rng.lognormvariate(mu, sigma)
                                                  for _ in range(100)]
    assert RunToRunNoise(4, 0.0).apply(0.02) == 0.02


def test_a_stream_seed_parses_back_and_nothing_else_does() -> None:
    from sloserve.perf.noise import parse_stream_seed, stream_seed

    assert parse_stream_seed(stream_seed(7, 2)) == (7, 2)
    assert parse_stream_seed(stream_seed(-3, 0)) == (-3, 0)
    for text in ("", "7", "7/instance/", "x/instance/1", "7/inst/1"):
        assert parse_stream_seed(text) is None, text
