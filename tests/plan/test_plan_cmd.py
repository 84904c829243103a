"""``sloserve plan`` (services/sloserve/services/plan_cmd.py) through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sloserve.services.cli import main

BASE = ["plan", "--model", "llama-2-7b", "--gpu", "a100", "--gpus", "2",
        "--ttft-slo", "2", "--tpot-slo", "0.1", "--num-requests", "100"]


def test_json_ranks_strategies_with_goodput_per_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--input-len", "512", "--output-len", "32", "--tp-sizes", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model"], out["gpu"], out["gpus"], out["mode"]) == ("llama-2-7b", "a100", 2, "fast")
    rows = out["strategies"]
    assert [r["name"] for r in rows] and {r["name"] for r in rows} == {"1m-tp1", "2m-tp1",
                                                                      "1p1d-tp1"}
    assert [r["rank"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["goodput_per_gpu"] == pytest.approx(r["goodput_rps"] / r["gpus"], abs=1e-3)
        assert r["architecture"] in ("collocated", "disaggregated")
    assert [r["goodput_per_gpu"] for r in rows] == sorted((r["goodput_per_gpu"] for r in rows),
                                                           reverse=True)
    assert out["elapsed_s"] > 0


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--gpus", "0", "--input-len", "10", "--output-len", "10"], "--gpus"),
        (["--ttft-slo", "0", "--input-len", "10", "--output-len", "10"], "--ttft-slo"),
        (["--tpot-slo", "-1", "--input-len", "10", "--output-len", "10"], "--tpot-slo"),
        (["--input-len", "10"], "--output-len"),
        (["--input-len", "10", "--output-len", "5", "--trace", "sharegpt"], "--trace"),
        ([], "--trace"),
        (["--input-len", "10", "--output-len", "5", "--hardware", "tpu-v9"], "--hardware"),
        (["--input-len", "10", "--output-len", "5", "--seeds", "0"], "--seeds"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(extra: list[str], flag: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        rc = main([*BASE, *extra])
        raise SystemExit(rc)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "plan.png"
    assert main([*BASE, "--input-len", "256", "--output-len", "16", "--tp-sizes", "1",
                 "--architectures", "collocated", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "1m-tp1" in capsys.readouterr().out


def test_trace_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--trace", "sharegpt", "--tp-sizes", "1", "--architectures",
                 "collocated", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["trace"] == "sharegpt" and len(out["strategies"]) == 2


def test_accurate_mode_reevaluates_collocated_under_policies(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--input-len", "256", "--output-len", "16", "--tp-sizes", "1",
                 "--gpus", "1", "--mode", "accurate", "--policies", "vllm,sarathi",
                 "--token-budgets", "512", "--accurate-requests", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in out["strategies"]}
    assert set(rows) == {"1m-tp1", "1m-tp1-sarathi512"}
    assert all(r["evaluated_by"] == "accurate" for r in rows.values())
    assert "fast_goodput_rps" in rows["1m-tp1"]
    assert out["cost_model"] == "real-profile"


def _plan_json(extra: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*BASE, "--input-len", "512", "--output-len", "32", "--tp-sizes", "1",
                 "--architectures", "collocated", "--json", *extra]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_hardware_defaults_to_the_gpu_calibration_and_keeps_the_paper_preset(
        capsys: pytest.CaptureFixture[str]) -> None:
    from sloserve.plan.presets import PRESETS

    auto = _plan_json([], capsys)
    paper = _plan_json(["--hardware", "ascend-910b3"], capsys)
    assert auto["hardware_preset"] == "a100" and paper["hardware_preset"] == "ascend-910b3"
    cal, p = PRESETS["a100"], PRESETS["ascend-910b3"]
    assert auto["dispatch_ms"] == {"rmsnorm": cal.dispatch_rmsnorm * 1e3,
                                   "attention": cal.dispatch_attention * 1e3,
                                   "mlp": cal.dispatch_mlp * 1e3}
    assert paper["dispatch_ms"] == {"rmsnorm": p.dispatch_rmsnorm * 1e3,
                                    "attention": p.dispatch_attention * 1e3,
                                    "mlp": p.dispatch_mlp * 1e3}
    assert paper["allreduce_floor_ms"] == pytest.approx(0.1)
    assert paper["efficiency"] == {"prefill": [0.65, 0.6, 0.6], "decode": [0.65, 0.3, 0.3]}
    good = {r["name"]: r["goodput_rps"] for r in auto["strategies"]}  # type: ignore[attr-defined]
    good_p = {r["name"]: r["goodput_rps"] for r in paper["strategies"]}  # type: ignore[attr-defined]
    assert good != good_p


def test_extend_upper_and_seeds_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_json(["--extend-upper", "--seeds", "2"], capsys)
    assert out["upper_bound"] == "doubled while feasible" and out["seeds"] == 2
    assert _plan_json([], capsys)["upper_bound"] == "1.2/T_min (paper)"


def test_accurate_mode_reevaluates_disaggregated_strategies_too(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--input-len", "256", "--output-len", "16", "--tp-sizes", "1",
                 "--mode", "accurate", "--policies", "vllm", "--accurate-requests", "40",
                 "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["strategies"]}
    assert set(rows) == {"1m-tp1", "2m-tp1", "1p1d-tp1"}
    assert all(r["evaluated_by"] == "accurate" for r in rows.values())
    assert "fast_goodput_rps" in rows["1p1d-tp1"] and rows["1p1d-tp1"]["goodput_rps"] > 0
