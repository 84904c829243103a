"""infra/experiments/bestserve_ops.py: main(argv) writes the reproduction JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "experiments" / "bestserve_ops.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bestserve_ops", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_short_run_writes_fast_and_accurate_goodput_per_preset(tmp_path: Path) -> None:
    out = tmp_path / "ops.json"
    assert _load().main(["--parts", "b", "--model", "llama-2-7b", "--gpus", "2", "--ops", "OP3",
                         "--top", "1", "--num-requests", "80", "--accurate-requests", "30",
                         "--ttft-slo", "2", "--tpot-slo", "0.1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    op = data["ops"]["OP3"]
    assert set(op["presets"]) == {"a100", "ascend-910b3"} and op["paper_error_pct"] == 8.6
    for res in op["presets"].values():
        archs = {row["architecture"] for row in res["accurate"]}
        assert "disaggregated" in archs  # the best ypzd is always checked in accurate mode
        for row in res["accurate"]:
            assert {"fast_rps", "accurate_rps", "fast_extended_rps",
                    "accurate_extended_rps", "upper_bound_rps"} <= set(row)
            assert row["fast_rps"] <= max(row["upper_bound_rps"], 0.1)  # Algorithm 8's cap


def test_bad_option_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _load().main(["--presets", "tpu"])
    assert "--presets" in capsys.readouterr().err
