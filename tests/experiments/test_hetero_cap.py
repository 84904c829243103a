"""The heterogeneous bar is set against the feasible share of the very workload the grid ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiment_scripts import load


def test_each_cell_compares_the_bar_with_its_workloads_feasible_shares(tmp_path: Path) -> None:
    grid = tmp_path / "h.json"
    load("beyond_capacity").main([
        "--num-requests", "30", "--jobs", "1", "--seed", "3", "--traces", "azure-code",
        "--instances", "1", "--slos", "hetero", "--seeds", "vllm", "--refs", "",
        "--hetero-rates", "0.5,2", "--qps-max-factor", "2", "--out", str(grid)])
    out = tmp_path / "cap.json"
    load("hetero_cap").main([str(grid), "--out", str(out)])
    g = json.loads(grid.read_text())
    (f,) = json.loads(out.read_text())["files"].values()
    assert f["seed"] == 3 and f["num_requests"] == 30
    (c,) = f["cells"]
    assert c["share"] == g["feasible"][c["cell"]]["share"]  # the same workload, rebuilt
    (row,) = g["cells"]
    for q, r in c["rates"].items():
        assert r["bar"] == round(1.2 * row["goodput_fixed"][q]["best_seed"], 4)
    bars = [r["bar"] for r in c["rates"].values()]
    assert c["beyond_expected"] == (max(bars) > c["expected_share"])
    assert c["beyond_p999"] == (max(bars) > c["share_p999"])
    assert f["beyond_expected"] == int(c["beyond_expected"])
    # a bar between the expected share and a lucky draw's is beyond the one, not the other
    for q, v in row["goodput_fixed"].items():
        v["best_seed"] = (c["expected_share"] + c["share_p999"]) / 2 / 1.2 if q == "0.5" \
            else 0.1
    for above_p999, bump in ((False, 0.0), (True, 0.5)):
        row["goodput_fixed"]["2.0"]["best_seed"] = 0.1 + bump
        grid.write_text(json.dumps(g))
        load("hetero_cap").main([str(grid), "--out", str(out)])
        (f,) = json.loads(out.read_text())["files"].values()
        (c2,) = f["cells"]
        assert c2["beyond_expected"] and c2["beyond_p999"] is above_p999


def test_a_file_that_is_not_a_grid_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": []}))
    out = tmp_path / "cap.json"
    with pytest.raises(SystemExit, match="bad.json: not a beyond_capacity.py file"):
        load("hetero_cap").main([str(bad), "--out", str(out)])
    assert not out.exists()
