"""The live stack's measured overhead as an optional part of the simulator's ground truth
(issue 14, item 4; ``sloserve.sim.overhead``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sloserve.perf.fixed import FixedTiming
from sloserve.sim.config import SimConfig
from sloserve.sim.overhead import DeliverySampler, OverheadProfile, OverheadSampler
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
    ('{"format": "sloserve-overhead-profile", "version": 1, "samples_s": [0.1], '
     '"delivery_s": [0.01, -1]}', "delivery_s[1]"),
    ('{"format": "sloserve-overhead-profile", "version": 1, "samples_s": [0.1], '
     '"delivery_s": 3}', "delivery_s"),
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


def test_delivery_lags_round_trip_and_an_old_profile_has_none(tmp_path: Path) -> None:
    prof = OverheadProfile((1e-4,), delivery_s=(0.004, 0.006, 0.2))
    prof.save(tmp_path / "p.json")
    assert OverheadProfile.load(tmp_path / "p.json") == prof
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["delivery_p50_s"] == 0.006 and saved["delivery_p99_s"] == 0.2
    assert OverheadProfile.load(_profile(tmp_path, [1e-4])).delivery_s == ()


def test_each_request_is_delivered_later_by_one_measured_lag() -> None:
    prof = OverheadProfile((1e-4,), delivery_s=(0.001, 0.002, 0.5))
    times = [1.0, 1.01, 1.02, 1.03, 1.04, 2.0]
    got = DeliverySampler(prof, 3).delivered("r7", times)
    shifts = {round(g - t, 9) for g, t in zip(got, times)}
    assert len(shifts) == 1 and shifts <= {0.001, 0.002, 0.5}  # one lag, a measured one
    # a request's draw is its own: the same whatever was delivered before it
    other = DeliverySampler(prof, 3)
    other.delivered("r1", times)
    assert other.delivered("r7", times) == got
    lags = [DeliverySampler(prof, 3).lag(f"r{k}") for k in range(200)]
    assert set(lags) == {0.001, 0.002, 0.5}
    assert lags != [DeliverySampler(prof, 4).lag(f"r{k}") for k in range(200)]


def test_delivery_moves_what_is_measured_and_not_what_is_scheduled(tmp_path: Path) -> None:
    """A constant delivery lag d, with no gap between batches: every token d later, so
    TTFT grows by d, TBT and the schedule (iterations, throughput's tokens) stay."""
    path = tmp_path / "d.json"
    OverheadProfile((0.0,), delivery_s=(0.05,)).save(path)
    no_gap = tmp_path / "z.json"
    OverheadProfile((0.0,)).save(no_gap)
    for metrics in ("exact", "stream"):
        plain = simulate(dataclasses.replace(BASE, overhead_profile=str(no_gap),
                                             metrics=metrics))
        late = simulate(dataclasses.replace(BASE, overhead_profile=str(path), metrics=metrics))
        assert late["iterations"] == plain["iterations"]
        assert late["output_tokens"] == plain["output_tokens"]
        assert late["ttft_p50"] == pytest.approx(plain["ttft_p50"] + 0.05, rel=2e-3)
        assert late["ttft_p99"] == pytest.approx(plain["ttft_p99"] + 0.05, rel=2e-3)
        assert late["tbt_p50"] == pytest.approx(plain["tbt_p50"], rel=2e-3)
