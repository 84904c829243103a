"""Refining a grid's goodput capacities retraces its bisection and narrows the bracket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiment_scripts import load


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grid") / "g.json"
    load("beyond_capacity").main([
        "--num-requests", "60", "--jobs", "1", "--traces", "sharegpt", "--instances", "1",
        "--slos", "tbt0.1", "--seeds", "vllm", "--qps-max-factor", "8", "--out", str(out)])
    return out


def test_refined_capacity_is_the_old_one_or_above_within_the_finer_step(
        grid: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    load("refine_goodput").main([str(grid), "--rel-tol", "0.01", "--jobs", "1",
                                 "--out", str(out)])
    old = {(r["cell"], r["policy"]): r for r in json.loads(grid.read_text())["results"]}
    new = json.loads(out.read_text())
    refined = 0
    for r in new["results"]:
        was = old[(r["cell"], r["policy"])]
        assert set(was["probes"]) <= set(r["probes"])  # the old probes are kept, as they were
        if was["at_limit"]["goodput"]:
            assert r == was
            continue
        refined += 1
        cap = r["capacity"]["goodput"]
        assert cap >= was["capacity"]["goodput"] == r["goodput_coarse"]
        shares = {float(q): p["goodput_share"] for q, p in r["probes"].items()}
        assert shares[cap] >= 0.9
        fail = min(q for q, s in shares.items() if q > cap and s < 0.9)
        assert (fail - cap) / fail <= 0.01   # the bracket the bisection ended on
        assert {k: v for k, v in r["capacity"].items() if k != "goodput"} == \
            {k: v for k, v in was["capacity"].items() if k != "goodput"}
    assert refined >= 2
    (cell,) = new["cells"]
    ours = next(r for r in new["results"] if r["policy"] == "slack")
    assert cell["goodput"]["ours"] == ours["capacity"]["goodput"]


@pytest.mark.parametrize("args, says", [
    (["--rel-tol", "0.05"], "--rel-tol"),
    (["--rel-tol", "0"], "--rel-tol"),
])
def test_bad_step_is_refused_by_name(grid: Path, tmp_path: Path, args: list[str],
                                     says: str) -> None:
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit, match=says):
        load("refine_goodput").main([str(grid), *args, "--out", str(out)])
    assert not out.exists()


def test_a_file_that_is_not_a_grid_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cells": []}))
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit, match="bad.json: not a beyond_capacity.py file"):
        load("refine_goodput").main([str(bad), "--out", str(out)])
    assert not out.exists()
