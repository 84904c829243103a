"""Sampling semantics: greedy, temperature, top-k, top-p, seeds; parameter validation."""

from __future__ import annotations

import math

import pytest
import torch

from sloserve.model.sampling import SamplingParams, sample

LOGITS = torch.log(torch.tensor([0.05, 0.5, 0.3, 0.15]))


def draws(params: SamplingParams, n: int = 2000, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [sample(LOGITS, params, gen) for _ in range(n)]


def test_temperature_zero_is_argmax() -> None:
    assert set(draws(SamplingParams(temperature=0.0), n=20)) == {1}


def test_top_k_keeps_only_the_k_most_likely() -> None:
    assert set(draws(SamplingParams(top_k=2))) == {1, 2}
    assert set(draws(SamplingParams(top_k=1), n=50)) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # sorted probs 0.5, 0.3, 0.15, 0.05: p=0.7 needs {0.5, 0.3}; p=0.5 needs only {0.5}
    assert set(draws(SamplingParams(top_p=0.7))) == {1, 2}
    assert set(draws(SamplingParams(top_p=0.5), n=50)) == {1}
    assert set(draws(SamplingParams(top_p=0.81))) == {1, 2, 3}


def test_temperature_one_samples_the_softmax() -> None:
    counts = torch.bincount(torch.tensor(draws(SamplingParams(), n=20000)), minlength=4)
    freq = counts.float() / counts.sum()
    torch.testing.assert_close(freq, LOGITS.softmax(-1), atol=0.015, rtol=0)


def test_low_temperature_sharpens_high_temperature_flattens() -> None:
    cold = draws(SamplingParams(temperature=0.2)).count(1)
    hot = draws(SamplingParams(temperature=5.0)).count(1)
    assert cold > 1800 and hot < 800


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    p = SamplingParams(temperature=1.0)
    assert draws(p, 50, seed=7) == draws(p, 50, seed=7)
    assert draws(p, 50, seed=7) != draws(p, 50, seed=8)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"),
     ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
     ({"stop": ("",)}, "stop"), ({"temperature": math.nan}, "temperature")],
)
def test_invalid_parameters_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
