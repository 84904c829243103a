"""Exact mode reproduces the pre-optimisation simulator bit for bit (issue 13, item 4).

The summaries in ``data/golden_summaries.json`` were produced by the simulator before
its event loop and hot paths were sped up (``infra/experiments/sim_golden.py``); the
same seed must still give the same summary, every field but the wall time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "golden_summaries.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_exact_mode_summary_equals_the_stored_pre_optimisation_summary(name: str) -> None:
    case = GOLDEN[name]
    out = simulate(SimConfig(**case["config"]))
    out.pop("sim_wall_s")
    assert out == case["summary"]
