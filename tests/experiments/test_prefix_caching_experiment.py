"""The prefix-caching experiment runs end to end and writes both comparisons."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("policy", ["sarathi", "slack"])
def test_prefix_caching_experiment_writes_caching_and_routing_rows(
        tmp_path: Path, policy: str) -> None:
    path = ROOT / "infra" / "experiments" / "prefix_caching.py"
    spec = importlib.util.spec_from_file_location("prefix_caching", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "p.json"
    mod.main(["--policy", policy, "--num-requests", "30", "--out", str(out)])
    got = json.loads(out.read_text())
    one, four = got["one_instance"], got["four_instances"]
    assert one["off"]["at_off_capacity"]["prefix_hit_rate"] is None  # caching off: no stats
    assert one["on"]["at_off_capacity"]["prefix_hit_rate"] > 0.3
    assert one["on"]["at_off_capacity"]["qps"] == one["off"]["capacity_qps"]
    assert four["prefix_aware"]["at_round_robin_capacity"]["prefix_routed_to_match"] > 0
    assert four["round_robin"]["at_round_robin_capacity"]["prefix_routed_to_match"] is None
    assert got["setup"]["workload"]["trace"] == "multiturn"
    assert got["setup"]["policy"] == policy
