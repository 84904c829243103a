"""The live stack's measured overhead as an optional part of the simulator's ground truth
(issue 14, item 4; ``sloserve.sim.overhead``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sloserve.perf.fixed import FixedTiming
from sloserve.sim.config import SimConfig
from sloserve.sim.overhead import OverheadProfile, OverheadSampler
from sloserve.sim.simulator import Simulation, simulate

BASE = SimConfig(policy="sarathi", trace="sharegpt", qps=2.0, num_requests=60, seed=3)


def _profile(tmp_path: Path, samples: list[float], name: str = "p.json") -> str:
    path = tmp_path / name
    OverheadProfile(tuple(samples), backend="sim", policy="sarathi",
                    source={"load_avg_1m": 0.5}).save(path)
    return str(path)


def test_a_profile_round_trips_through_its_json_file(tmp_path: Path) -> None:
    prof = OverheadProfile((3e-5, 2e-5, 4e-3), backend="vllm", policy="ascendra",
                           overlap=False, source={"command": "x"})
    prof.save(tmp_path / "p.json")
    back = OverheadProfile.load(tmp_path / "p.json")
    assert back == prof
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["count"] == 3 and saved["p50_s"] == 3e-5 and saved["p99_s"] == 4e-3


@pytest.mark.parametrize(("text", "field"), [
    ('{"format": "other", "version": 1, "samples_s": [0.1]}', "format"),
    ('{"format": "sloserve-overhead-profile", "version": 9, "samples_s": [0.1]}', "version"),
    ('{"format": "sloserve-overhead-profile", "version": 1, "samples_s": []}', "samples_s"),
    ('{"format": "sloserve-overhead-profile", "version": 1, "samples_s": [0.1, -2]}',
     "samples_s[1]"),
    ('{"format": "sloserve-overhead-profile", "version": 1, "samples_s": [0.1, "a"]}',
     "samples_s[1]"),
    ("not json", "not JSON"),
])
def test_a_bad_profile_is_refused_naming_the_field(tmp_path: Path, text: str,
                                                   field: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"--overhead-profile.*" + field.replace("[", r"\[")):
        simulate(dataclasses.replace(BASE, overhead_profile=str(path)))


def test_the_sampler_draws_the_measured_values_deterministically_for_a_seed() -> None:
    prof = OverheadProfile((1e-4, 2e-4, 9e-3))
    a = [OverheadSampler(prof, 7).gap() for _ in range(1)]
    s1, s2, s3 = OverheadSampler(prof, 7), OverheadSampler(prof, 7), OverheadSampler(prof, 8)
    draws1 = [s1.gap() for _ in range(200)]
    assert draws1 == [s2.gap() for _ in range(200)]
    assert draws1 != [s3.gap() for _ in range(200)]
    assert set(draws1) == set(prof.samples_s) and a[0] == draws1[0]


def test_the_profile_delays_back_to_back_batches_by_its_gaps_and_nothing_else(
        tmp_path: Path) -> None:
    gap = 0.004
    cfg = dataclasses.replace(BASE, timing=FixedTiming(0.02), record_decisions=True,
                              record_samples=True, overhead_profile=_profile(tmp_path, [gap]))
    sim = Simulation(cfg)
    sim.run()
    assert sim.plans is not None
    gaps = [round(b[1] - a[2], 9) for a, b in zip(sim.plans, sim.plans[1:], strict=False)]
    assert gaps.count(gap) > 0.8 * len(gaps)  # back to back: exactly the measured gap
    assert all(g == gap or g > 0 for g in gaps)  # else the instance sat idle till an arrival
    # the perf model learns the batch's execution only (the live executor's duration)
    assert sim.samples and all(s.duration == pytest.approx(0.02) for s in sim.samples)


def test_a_profile_changes_simulated_timings_deterministically(tmp_path: Path) -> None:
    path = _profile(tmp_path, [1e-5, 5e-5, 2e-4, 3e-3])
    plain = simulate(BASE)
    a = simulate(dataclasses.replace(BASE, overhead_profile=path))
    b = simulate(dataclasses.replace(BASE, overhead_profile=path))
    other = simulate(dataclasses.replace(BASE, overhead_profile=path, seed=4))
    drop = ("sim_wall_s",)
    assert {k: v for k, v in a.items() if k not in drop} == {
        k: v for k, v in b.items() if k not in drop}
    assert a["tbt_p50"] > plain["tbt_p50"] and a["ttft_p50"] > plain["ttft_p50"]
    assert a["overhead_profile"] == path and "overhead_profile" not in plain
    assert other["ttft_p50"] != a["ttft_p50"]
    # the workload (lengths, arrivals) is the same with and without a profile
    assert a["requests"] == plain["requests"] and a["output_tokens"] == plain["output_tokens"]
