"""``simulate_draws``: one workload under several draws of the ground truth's noise."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from sloserve.services.cli import main
from sloserve.sim.config import SimConfig
from sloserve.sim.draws import simulate_draws
from sloserve.sim.simulator import simulate

CFG = SimConfig(policy="ascendra", instances=3, hp_instances=1, trace="sharegpt",
                num_requests=60, qps=8.0, seed=4, noise_streams="instance", noise_seed=7)


def test_each_varying_metric_is_the_median_of_the_draws_seeded_one_apart() -> None:
    out = simulate_draws(CFG, 3)
    runs = [simulate(dataclasses.replace(CFG, noise_seed=s)) for s in (7, 8, 9)]
    assert out["noise_draws"]["noise_seeds"] == [7, 8, 9]
    assert out["ttft_p99"] == statistics.median(r["ttft_p99"] for r in runs)
    assert out["noise_draws"]["range"]["ttft_p99"] == [min(r["ttft_p99"] for r in runs),
                                                        max(r["ttft_p99"] for r in runs)]
    assert out["noise_draws"]["first_draw"]["ttft_p99"] == runs[0]["ttft_p99"]
    # the draws differ (else the median would say nothing) and integers stay integers
    assert len({r["ttft_p99"] for r in runs}) > 1
    assert isinstance(out["iterations"], int)
    assert out["iterations"] in {r["iterations"] for r in runs}
    # what every draw shares is reported once, unchanged
    assert "qps" not in out["noise_draws"]["range"] and out["qps"] == 8.0
    assert out["requests"] == 60


def test_one_draw_is_the_plain_simulation_with_an_empty_band() -> None:
    out = simulate_draws(CFG, 1)
    plain = simulate(CFG)
    assert out["noise_draws"]["range"] == {}
    assert {k: v for k, v in out.items() if k not in ("noise_draws", "sim_wall_s")} == {
        k: v for k, v in plain.items() if k != "sim_wall_s"}


@pytest.mark.parametrize(("cfg", "draws", "words"), [
    (CFG, 0, "must be an integer >= 1"),
    (dataclasses.replace(CFG, noise_cv=0.0), 2, "needs --noise-cv > 0"),
])
def test_bad_draws_are_refused_naming_the_flag(cfg: SimConfig, draws: int, words: str) -> None:
    with pytest.raises(ValueError, match="noise_draws \\(--noise-draws\\)") as err:
        simulate_draws(cfg, draws)
    assert words in str(err.value)


def test_simulate_cli_reports_the_medians_and_their_ranges(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policy", "sarathi", "--trace", "sharegpt", "--num-requests", "30",
            "--qps", "3", "--noise-draws", "3"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lo, hi = out["noise_draws"]["range"]["ttft_p50"]
    assert lo <= out["ttft_p50"] <= hi and lo < hi
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "medians of 3 noise draws (seeds 0..2)" in text and " ms .. " in text
    assert main([*argv, "--noise-cv", "0"]) == 2
    assert "--noise-draws" in capsys.readouterr().err
