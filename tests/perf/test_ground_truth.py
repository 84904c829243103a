from __future__ import annotations

import pytest

from sloserve.batch import BatchShape
from sloserve.perf.base import TimingSource
from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.profiles import available_profiles, load_mlp_profile
from sloserve.perf.regression import AscendraRegression
from sloserve.perf.sweep import profile_sweep

SHAPES = [
    BatchShape(decodes=(100,)),
    BatchShape(prefills=((777, 300),), decodes=(50, 900, 2000)),
    BatchShape(prefills=((4000, 0),)),
]


@pytest.mark.parametrize("model,gpu", [("llama-3-8b", "a100"), ("llama-2-7b", "h100")])
def test_same_seed_gives_the_same_times_and_noise_has_the_requested_cv(
    model: str, gpu: str
) -> None:
    a, b = ProfileTiming(model, gpu, seed=7), ProfileTiming(model, gpu, seed=7)
    assert isinstance(a, TimingSource)
    shape = SHAPES[1]
    times = [a.batch_time(shape) for _ in range(2000)]
    assert times == [b.batch_time(shape) for _ in range(2000)]
    assert times != [ProfileTiming(model, gpu, seed=8).batch_time(shape) for _ in range(2000)]
    mean = sum(times) / len(times)
    cv = (sum((t - mean) ** 2 for t in times) / len(times)) ** 0.5 / mean
    assert mean == pytest.approx(a.noiseless_time(shape), rel=0.01)
    assert cv == pytest.approx(0.03, rel=0.15)


@pytest.mark.parametrize("tp", [1, 2])
def test_decode_batch_times_of_a_fixed_size_are_decode_batch_time_bit_for_bit(tp: int) -> None:
    """A steady run's batch times (``sim.steady``): the size's terms computed once, the
    same floats and the same noise draws, in the same order, as one call per batch."""
    fast, ref = (ProfileTiming("llama-3-8b", "a100", seed=3, tp=tp) for _ in range(2))
    for n in (1, 2, 7, 64, 255, 3000):  # 3000: past the profile's last point
        time_of = fast.decode_batch_times(n)
        for cs in (n, 1_000 * n + 17, 12_345 * n + 1):
            assert time_of(cs) == ref.decode_batch_time(n, cs)
    noiseless = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0, tp=tp)
    assert noiseless.decode_batch_times(5)(700) == noiseless.noiseless_time(
        BatchShape(decodes=(100, 200, 100, 150, 150)))


def test_zero_noise_gives_the_noiseless_time() -> None:
    gt = ProfileTiming("llama-2-7b", "a100", noise_cv=0.0)
    assert [gt.batch_time(s) for s in SHAPES] == [gt.noiseless_time(s) for s in SHAPES]
    assert gt.batch_time(BatchShape()) == 0.0


@pytest.mark.parametrize("model,gpu", available_profiles())
def test_noiseless_time_is_monotone_in_tokens_and_context(model: str, gpu: str) -> None:
    gt = ProfileTiming(model, gpu, noise_cv=0.0)
    prefill = [gt.noiseless_time(BatchShape(prefills=((c, 0),))) for c in range(1, 6000, 7)]
    assert all(x <= y for x, y in zip(prefill, prefill[1:], strict=False))
    decode = [gt.noiseless_time(BatchShape(decodes=(500,) * b)) for b in range(1, 300)]
    assert all(x < y for x, y in zip(decode, decode[1:], strict=False))
    ctx = [gt.noiseless_time(BatchShape(prefills=((256, c),))) for c in range(0, 4000, 50)]
    assert all(x < y for x, y in zip(ctx, ctx[1:], strict=False))


def test_linear_part_equals_the_profile_at_profiled_points() -> None:
    gt = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0)
    prof = load_mlp_profile("llama-3-8b", "a100")
    lin = prof.layer_times() * 32 + prof.ops["emb"]
    checked = 0
    for i, n in enumerate(prof.num_tokens.tolist()):
        if lin[i] < lin[: i + 1].max():
            continue  # a dip below an earlier point: the ground truth keeps the running max
        assert gt.linear_time(n) == pytest.approx(lin[i], rel=1e-12)
        checked += 1
    assert checked > 200
    mid = (prof.num_tokens[-2] + prof.num_tokens[-1]) // 2
    assert lin[-2] <= gt.linear_time(int(mid)) <= lin[-1]
    assert gt.linear_time(40000) > gt.linear_time(32768)  # extrapolated beyond the profile
    shape = BatchShape(prefills=((1000, 0),))
    assert gt.noiseless_time(shape) > gt.linear_time(1000)


def test_unknown_model_or_gpu_is_rejected_with_the_available_profiles() -> None:
    with pytest.raises(ValueError, match=r"llama-3-8b.*h100.*available profiles.*llama-2-7b"):
        ProfileTiming("llama-3-8b", "h100")
    with pytest.raises(ValueError, match="mistral-7b"):
        ProfileTiming("mistral-7b", "a100")
    with pytest.raises(ValueError, match="noise_cv"):
        ProfileTiming("llama-2-7b", "a100", noise_cv=-0.1)


def test_regression_fitted_on_a_profile_sweep_predicts_the_ground_truth() -> None:
    gt = ProfileTiming("llama-3-8b", "a100", seed=1)
    samples = profile_sweep(gt, get_model("llama-3-8b"))
    assert 200 <= len(samples) <= 400
    reg = AscendraRegression(get_model("llama-3-8b"), get_hardware("a100"))
    reg.fit(samples)
    held_out = profile_sweep(
        ProfileTiming("llama-3-8b", "a100", seed=2), get_model("llama-3-8b"), seed=5
    )
    assert reg.mape(held_out) < 0.10
