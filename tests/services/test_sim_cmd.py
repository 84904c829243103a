"""The `simulate` / `capacity` CLI contract that later tooling calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sloserve.services.cli import main

CONTRACT = ["requests", "completed", "dropped", "goodput_share", "goodput_rps", "ttft_p50",
            "ttft_p90", "ttft_p99", "tbt_p50", "tbt_p99", "mean_tbt_p99", "throughput_tok_s",
            "sim_wall_s", "tbt_token_p99", "sched_delay_p50", "token_slo_attainment",
            "preemptions"]
BASE = ["--model", "llama-3-8b", "--gpu", "a100", "--num-requests", "40", "--ttft-slo", "1",
        "--tbt-slo", "0.15"]


def test_simulate_json_carries_every_contract_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "sarathi", "--trace", "sharegpt", "--qps", "2",
                 *BASE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(CONTRACT) <= set(out)
    assert out["requests"] == out["completed"] == 40


def test_capacity_json_reports_probes_for_the_named_criterion(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--policy", "vllm", "--trace", "sharegpt", *BASE, "--criterion",
                 "tail", "--target", "0.9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["criterion"] == "tail" and out["probes"]
    assert {"qps", "goodput_share", "tbt_token_p99", "sched_delay_p50"} <= set(out["probes"][0])


def test_trace_file_with_too_long_requests_drops_them_with_a_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.csv"
    f.write_text("input_len,output_len\n100,20\n9000,50\n200,10\n")
    assert main(["simulate", "--policy", "vllm", "--trace-file", str(f), "--qps", "1",
                 *BASE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["too_long"] > 0 and out["completed"] == out["requests"] > 0


def test_capacity_reports_too_long_rows_drops_and_rates_at_each_probe(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: nothing hidden in the workload, the drop share judged by tail."""
    f = tmp_path / "t.csv"
    f.write_text("input_len,output_len\n" + "100,20\n9000,50\n200,10\n" * 10)
    args = ["capacity", "--policy", "vllm", "--trace-file", str(f), *BASE,
            "--criterion", "tail", "--qps-start", "2"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_drop_share"] == 0.01 and out["probes"]
    for p in out["probes"]:
        assert p["too_long"] > 0  # the 9000-token rows never run: counted, at every probe
        assert p["offered_rps"] < p["qps"]  # what ran came at less than the rate asked
        assert {"dropped", "drop_share", "sched_delay_p50_all", "offered_rps",
                "served_rps"} <= p.keys()
    assert set(out["at_capacity"]) == {"offered_rps", "served_rps", "dropped", "drop_share",
                                       "too_long"}
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "drops counted, <= 0.01 dropped" in text and "too long" in text
    assert "offered" in text and "served" in text


def test_max_drop_share_out_of_range_is_refused_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--policy", "vllm", "--trace", "sharegpt", *BASE, "--criterion",
                 "tail", "--max-drop-share", "2"]) == 2
    assert "max_drop_share (--max-drop-share): must be a share in [0, 1]" in (
        capsys.readouterr().err)


def test_compare_reports_rates_drops_and_too_long_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.csv"
    f.write_text("input_len,output_len\n" + "100,20\n9000,50\n" * 10)
    assert main(["compare", "--trace-file", str(f), "--qps", "2", "--instances", "1",
                 *BASE]) == 0
    head, cols, *rows = capsys.readouterr().out.splitlines()
    assert "2.0 req/s asked" in head and "offered" in head
    assert "trace rows too long for the context dropped" in head
    assert "drop_share" in cols and "served_rps" in cols and rows


def test_bad_trace_file_gets_one_line_naming_it_and_exit_code_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("foo,bar\n1,2\n")
    proc = subprocess.run([sys.executable, "-m", "sloserve.services.cli", "simulate", "--policy",
                           "sarathi", "--trace-file", str(f), "--qps", "1", *BASE, "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.csv" in lines[0]


def test_hp_instances_without_ascendra_is_rejected_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--policy", "sarathi", "--instances", "3", "--hp-instances", "1",
               "--trace", "sharegpt", "--qps", "1", *BASE])
    assert rc == 2 and "--hp-instances: " in capsys.readouterr().err
