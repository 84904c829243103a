"""The issue-13 capacity experiment runs end to end and compares ours with the best seed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    path = ROOT / "infra" / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cell_holds_ours_best_seed_ratio_and_bound(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    load("beyond_capacity").main([
        "--num-requests", "40", "--jobs", "1", "--traces", "azure-code", "--instances", "1",
        "--slos", "tbt0.5", "--seeds", "vllm,sarathi", "--qps-max-factor", "2",
        "--out", str(out)])
    got = json.loads(out.read_text())
    assert {r["policy"] for r in got["results"]} == {"slack", "slack-noshed", "vllm", "sarathi"}
    (cell,) = got["cells"]
    assert cell["cell"] == "azure-code/x1/tbt0.5" and cell["bound_goodput_qps"] > 0
    for c in ("goodput", "tail", "token"):
        seeds = [r["capacity"][c] for r in got["results"] if r["policy"] in ("vllm", "sarathi")]
        assert cell[c]["best_seed"] == max(seeds)
        assert "ours_noshed" in cell[c]
