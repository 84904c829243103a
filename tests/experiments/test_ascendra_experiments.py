"""The Ascendra experiment scripts (§8.4, §8.6) run end to end and write a table row."""

from __future__ import annotations

import json
from pathlib import Path

from experiment_scripts import load


def test_overload_experiment_writes_paper_ours_and_setup(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    load("ascendra_overload").main(["--num-requests", "60", "--qps", "12", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["paper"]["served_under_slo_ratio"] == 1.74
    assert {r["policy"] for r in got["rows"]} == {"ascendra-2L1H", "vllmx3", "sarathix3"}
    for r in got["rows"]:
        assert r["served_under_slo"] + r["dropped"] + r["violated"] == 60
    assert "served_under_slo_ratio_vs_best_baseline" in got["ours"] and got["setup"]["qps"] == 12


def test_value_function_experiment_covers_edf_fcfs_sjf(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    load("ascendra_value_functions").main(["--num-requests", "40", "--qps", "9",
                                           "--out", str(out)])
    got = json.loads(out.read_text())
    assert set(got["ours"]["goodput_share"]) == {"edf", "fcfs", "sjf"}
    assert {(r["value_function"], r["qps"]) for r in got["rows"]} == {
        ("edf", 9.0), ("fcfs", 9.0), ("sjf", 9.0)}
