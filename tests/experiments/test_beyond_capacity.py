"""The issue-13 capacity experiment runs end to end and compares ours with the best seed."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from experiment_scripts import load

from sloserve.policies.flags import add_policy_flags


def test_cell_holds_ours_best_seed_ratio_and_bound(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    load("beyond_capacity").main([
        "--num-requests", "40", "--jobs", "1", "--traces", "azure-code", "--instances", "1",
        "--slos", "tbt0.5", "--seeds", "vllm,sarathi", "--variants", "serve",
        "--qps-max-factor", "2", "--out", str(out)])
    got = json.loads(out.read_text())
    assert {r["policy"] for r in got["results"]} == {"slack", "slack-serve", "vllm", "sarathi",
                                                     "oracle"}
    (cell,) = got["cells"]
    assert cell["cell"] == "azure-code/x1/tbt0.5" and cell["bound_goodput_qps"] > 0
    for c in ("goodput", "tail", "token"):
        seeds = [r["capacity"][c] for r in got["results"] if r["policy"] in ("vllm", "sarathi")]
        assert cell[c]["best_seed"] == max(seeds)  # the oracle and our variants are not seeds
        assert "slack-serve" in cell[c] and "oracle" in cell[c]
    assert cell["goodput_target"] == 0.9
    for r in got["results"]:  # every probe keeps what the core's tail judges, and the rates
        assert all({"sched_delay_p50_all", "drop_share", "too_long", "offered_rps",
                    "served_rps"} <= p.keys() for p in r["probes"].values())
        assert "tail_scheduled" not in r["capacity"]  # one definition of tail (issue 38)


def test_tail_is_the_cores_and_counts_a_dropped_request_as_never_scheduled() -> None:
    mod = load("beyond_capacity")
    from sloserve.metrics import meets
    from sloserve.policies.slack import SlackConfig
    from sloserve.sim.config import SimConfig

    assert mod.CRITERIA == ("goodput", "tail", "token")
    cfg = SimConfig(policy="slack", trace="sharegpt", num_requests=60, qps=80.0,
                    policy_config=SlackConfig(late="drop"))
    from sloserve.sim.capacity import find_capacity
    from sloserve.sim.simulator import simulate

    res = mod.run_setup(("c", "slack", cfg), qps_max_factor=4.0)
    core = find_capacity(cfg, "tail", 0.9, qps_start=1.0, qps_max=4.0)
    assert res["capacity"]["tail"] == core["capacity_qps"]  # the same probes, the same rule
    assert {str(p["qps"]) for p in core["probes"]} <= res["probes"].keys()

    heavy = simulate(cfg)
    assert heavy["dropped"] >= 31  # most of them: their median delay is infinite (None)
    assert heavy["sched_delay_p50_all"] is None and heavy["sched_delay_p50"] is not None
    assert not meets(heavy, "tail", tbt_slo=cfg.tbt_slo)


def test_hetero_goodput_target_scales_with_the_feasible_share() -> None:
    mod = load("beyond_capacity")
    assert mod.goodput_target("tbt0.1", 0.5) == 0.9
    assert mod.goodput_target("hetero", 0.5) == 0.45


def test_feasible_share_with_noise_is_each_requests_chance_alone() -> None:
    mod = load("beyond_capacity")
    from sloserve.batch import BatchShape
    from sloserve.perf.ground_truth import ProfileTiming
    from sloserve.perf.models import get_model
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import build_timing, build_workload

    cfg = SimConfig(policy="vllm", trace="sharegpt", num_requests=300, qps=1.0,
                    **mod.SLOS["hetero"])
    quiet = mod.feasible_alone(dataclasses.replace(cfg, noise_cv=0.0))
    assert quiet["expected_share"] == quiet["share_p999"] == quiet["share"]
    got = mod.feasible_alone(cfg)
    assert got["expected_share"] < got["share_p999"]
    # the same chance drawn: every request alone, with mean-one lognormal noise of its CV
    reqs = build_workload(cfg, get_model(cfg.model), build_timing(cfg)).requests
    t = ProfileTiming(cfg.model, cfg.gpu, noise_cv=0.0, tp=cfg.tp)
    prefill = np.array([t.batch_time(BatchShape(prefills=((r.prompt_len, 0),))) for r in reqs])
    decode = np.array([t.batch_time(BatchShape(decodes=(r.prompt_len + 1,))) for r in reqs])
    ttft = np.array([r.slo.ttft for r in reqs])
    tbt = np.array([r.slo.tbt if r.output_len > 1 else np.inf for r in reqs])
    sigma = np.sqrt(np.log1p(cfg.noise_cv ** 2))
    rng = np.random.default_rng(0)
    draws = 2000
    noise = rng.lognormal(-sigma ** 2 / 2, sigma, size=(2, draws, len(reqs)))
    # a mean TBT over many gaps: in time where one decode alone is, else one draw's luck
    shares = ((prefill * noise[0] <= ttft)
              & ((decode <= tbt) | (decode * noise[1] <= tbt))).mean(axis=1)
    assert abs(shares.mean() - got["expected_share"]) < 4 * shares.std() / np.sqrt(draws)
    assert np.quantile(shares, 0.999) <= got["share_p999"] + 0.5 / len(reqs)


def test_hetero_cells_measure_goodput_at_fixed_rates(tmp_path: Path) -> None:
    out = tmp_path / "h.json"
    load("beyond_capacity").main([
        "--num-requests", "30", "--jobs", "1", "--traces", "azure-code", "--instances", "1",
        "--slos", "hetero", "--seeds", "vllm", "--refs", "", "--hetero-rates", "0.5,2",
        "--qps-max-factor", "2", "--out", str(out)])
    got = json.loads(out.read_text())
    (cell,) = got["cells"]
    assert cell["goodput"]["ours"] is None  # no capacity search on these cells
    assert set(cell["goodput_fixed"]) == {"0.5", "2.0"}
    for v in cell["goodput_fixed"].values():
        assert v["best_seed_policy"] == "vllm" and 0 <= v["ours"] <= 1
    assert 0 < got["feasible"][cell["cell"]]["share"] < 1
    assert cell["bound"]["target"] == round(0.9 * got["feasible"][cell["cell"]]["share"], 4)


def test_slacks_knob_flags_reach_ours_only_and_bad_ones_are_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bc = load("beyond_capacity")
    out = tmp_path / "b.json"
    bc.main(["--num-requests", "20", "--jobs", "1", "--traces", "azure-code", "--instances",
             "1", "--slos", "hetero", "--seeds", "vllm", "--refs", "", "--variants", "defer",
             "--qps-max-factor", "1", "--hetero-rates", "1", "--late-max-running", "64",
             "--late-in-budget", "--out", str(out)])
    assert {r["policy"] for r in json.loads(out.read_text())["results"]} == {
        "slack", "slack-defer", "vllm"}
    ap = argparse.ArgumentParser()
    add_policy_flags(ap)
    assert bc.ours_config(ap.parse_args([])) is None  # ours at its defaults
    wide = bc.ours_config(ap.parse_args(["--late-max-running", "64", "--late-in-budget"]))
    assert wide == bc.SlackConfig(late_max_running=64, late_in_budget=True)
    items = bc.setups(20, ["sharegpt"], [1], ["hetero"], ["vllm"], [], ["defer"], wide)
    cfgs = {label: cfg.policy_config for _, label, cfg in items}
    assert cfgs["slack"].late_max_running == 64 and cfgs["slack"].late_in_budget
    assert cfgs["slack-defer"].late == "defer" and cfgs["slack-defer"].late_in_budget
    assert cfgs["vllm"] is None
    for bad, words in ((["--late-max-running", "0"], "--late-max-running: must be >= 1"),
                       (["--token-budget", "64"], "--token-budget: not a knob of policy "
                                                  "'slack'")):
        with pytest.raises(SystemExit, match=words):
            bc.main(["--out", str(tmp_path / "x.json"), *bad])


def test_the_report_flags_a_bar_and_capacities_above_the_long_run_bound() -> None:
    rep = load("beyond_report")
    rows = [{"cell": c, "bound": {"capacity_long_run_qps": 13.78}, "goodput": {"best_seed": b}}
            for c, b in (("arxiv/x3/tbt0.5", 12.0), ("arxiv/x3/tbt0.1", 9.0))]
    caps = (("arxiv/x3/tbt0.5", "slack", 13.9), ("arxiv/x3/tbt0.5", "vllm", 12.0),
            ("arxiv/x3/tbt0.1", "slack", 11.0), ("arxiv/x3/tbt0.1", "vllm", None))
    results = [{"cell": c, "policy": p, "capacity": {"goodput": g}} for c, p, g in caps]
    text = rep.long_run_table(rows, results)
    assert "| arxiv/x3/tbt0.5 | 13.78 | 14.40 | yes | slack 13.90 |" in text
    assert "| arxiv/x3/tbt0.1 | 13.78 | 10.80 | no | – |" in text


def test_the_report_judges_recorded_probes_by_the_cores_tail_rule() -> None:
    rep = load("beyond_report")
    new = {"tbt_token_p99": 0.05, "sched_delay_p50_all": 1.0, "dropped": 5, "drop_share": 0.05}
    assert rep.tail_met(new, 100, 0.1, 0.1) and not rep.tail_met(new, 100, 0.1, 0.01)
    # a file from before issue 38: no drop share (dropped / n), an infinite median
    old = {"tbt_token_p99": 0.05, "sched_delay_p50_all": 1.0, "dropped": 20}
    assert not rep.tail_met(old, 100, 0.1, 0.1) and rep.tail_met(old, 1000, 0.1, 0.1)
    assert not rep.tail_met({**old, "sched_delay_p50_all": float("inf")}, 1000, 0.1, 1.0)
    assert not rep.tail_met({**new, "tbt_token_p99": 0.2}, 100, 0.1, 1.0)
