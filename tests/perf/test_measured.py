"""``MeasuredTiming``: a device's measured batch times as simulator ground truth."""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.hardware import Hardware, get_hardware
from sloserve.perf.measured import MeasuredTiming, features, load_samples, save_samples
from sloserve.services import profile_cmd
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

TRUTH = (2e-3, 4e-4, 1e-4, 5e-5, 2e-8, 1e-7)  # seconds per unit of each feature


def synthetic(n: int = 60, seed: int = 0) -> list[BatchSample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        shape = BatchShape(
            prefills=tuple((rng.randint(1, 256), rng.randint(0, 512))
                           for _ in range(rng.randint(0, 2))),
            decodes=tuple(rng.randint(1, 1024) for _ in range(rng.randint(0 if _ else 1, 16))),
        )
        if not shape.is_empty:
            out.append(BatchSample(shape, sum(c * f for c, f in zip(TRUTH, features(shape)))))
    return out


def test_fit_recovers_a_linear_ground_truth() -> None:
    timing = MeasuredTiming(synthetic(), noise_cv=0.0)
    assert timing.coefficients == pytest.approx(TRUTH, rel=1e-6, abs=1e-12)
    held = synthetic(seed=1)
    assert timing.mape(held) < 1e-9
    assert timing.batch_time(held[0].shape) == pytest.approx(held[0].duration)
    assert timing.batch_time(BatchShape()) == 0.0


def test_coefficients_stay_non_negative_so_bigger_batches_never_get_faster() -> None:
    # decode time falls with batch size here: an unconstrained fit would go negative
    samples = [BatchSample(BatchShape(decodes=(100,) * b), 0.02 - 0.0005 * b) for b in range(1, 30)]
    timing = MeasuredTiming(samples, noise_cv=0.0)
    assert min(timing.coefficients) >= 0.0
    times = [timing.batch_time(BatchShape(decodes=(100,) * b)) for b in (1, 10, 100, 1000)]
    assert times == sorted(times)


def test_noise_is_lognormal_with_mean_one_and_the_given_cv() -> None:
    shape = BatchShape(prefills=((128, 64),), decodes=(300, 20))
    base = MeasuredTiming(synthetic(), noise_cv=0.0).batch_time(shape)
    noisy = MeasuredTiming(synthetic(), seed=3, noise_cv=0.1)
    draws = [noisy.batch_time(shape) / base for _ in range(20000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.005)
    assert statistics.stdev(draws) == pytest.approx(0.1, rel=0.05)
    again = MeasuredTiming(synthetic(), seed=3, noise_cv=0.1)
    assert [again.batch_time(shape) for _ in range(5)] == pytest.approx(
        [b * base for b in draws[:5]])


def test_samples_file_round_trip_registers_the_measured_hardware(tmp_path: Path) -> None:
    hw = Hardware("cpu", 1.5e11, 1.2e10, 2.4e10)
    path = tmp_path / "prof.json"
    save_samples(path, synthetic(), hw, model="tiny", device="cpu")
    samples, got_hw, meta = load_samples(path)
    assert got_hw == hw and meta == {"model": "tiny", "device": "cpu"}
    assert [(s.shape, s.duration) for s in samples] == [(s.shape, s.duration) for s in synthetic()]
    timing = MeasuredTiming.from_file(path, noise_cv=0.0)
    assert get_hardware("cpu") == hw
    assert timing.coefficients == pytest.approx(TRUTH, rel=1e-6, abs=1e-12)
    bare = tmp_path / "bare.json"  # a plain list of samples is accepted too
    bare.write_text(json.dumps(json.loads(path.read_text())["samples"]))
    assert load_samples(bare)[1] is None


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"samples": [{"prefills": [], "decodes": [5]}]}),
     json.dumps([{"prefills": [[0, 5]], "decodes": [], "duration": 0.1}]),
     json.dumps([{"prefills": [], "decodes": [5], "duration": -1}]), json.dumps([]),
     json.dumps([{"prefills": [], "decodes": [5], "duration": 0.1}])],
    ids=["bad-json", "no-duration", "zero-chunk", "negative-time", "empty", "too-few"],
)
def test_bad_samples_file_raises_one_error_naming_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "broken-profile.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="broken-profile.json") as info:
        MeasuredTiming.from_file(path)
    assert "\n" not in str(info.value)


def test_profile_command_output_drives_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    profile_cmd.add_parser(parser.add_subparsers())
    out = tmp_path / "cpu.json"
    args = parser.parse_args(["profile", "--model", "tiny", "--max-tokens", "32",
                              "--max-context", "64", "--repeats", "1", "--json",
                              "--out", str(out)])
    assert profile_cmd.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    samples = load_samples(out)[0]
    assert report["samples"] == len(samples) >= 30
    kinds = {(bool(s.shape.prefills), bool(s.shape.decodes)) for s in samples}
    assert kinds == {(True, False), (False, True), (True, True)}  # prefill, decode, mixed
    assert report["samples_file"] == str(out) and report["model"] == "tiny"
    assert len(report["coefficients"]) == 5 and math.isfinite(report["mape_holdout"])
    result = simulate(SimConfig(policy="sarathi", model="tiny", trace=None,
                                fixed_lengths=(40, 8), num_requests=20, qps=5.0,
                                timing_profile=str(out)))
    assert result["completed"] == 20 and result["gpu"] == "cpu-profile"
