"""``simulate --controller-lag``: instances' reports reach the controller after the
gateway's measured lag, so an HP's ticket is freed (and its queue seen) that much later."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from sloserve.controller import Dispatch
from sloserve.sim.config import SimConfig
from sloserve.sim.overhead import ControllerLag, OverheadProfile
from sloserve.sim.simulator import Simulation


def _profile(tmp_path: Path, lag: float | None) -> str:
    path = tmp_path / f"lag{lag}.json"
    OverheadProfile((0.0,), delivery_s=() if lag is None else (lag,)).save(path)
    return str(path)


def _ascendra(profile: str, lag: bool) -> tuple[dict[str, Any], collections.Counter[str]]:
    sim = Simulation(SimConfig(
        policy="ascendra", instances=3, hp_instances=1, trace="sharegpt", num_requests=300,
        qps=6.5, seed=4, overlap=True, record_decisions=True, overhead_profile=profile,
        controller_lag=lag))
    out = sim.run()
    assert sim.controller.decisions is not None
    causes: collections.Counter[str] = collections.Counter(
        a.cause for a in sim.controller.decisions if isinstance(a, Dispatch))
    return out, causes


def test_a_late_controller_gives_the_hp_fewer_tickets_and_every_request_still_ends(
        tmp_path: Path) -> None:
    _, prompt = _ascendra(_profile(tmp_path, 0.0), lag=False)
    out, late = _ascendra(_profile(tmp_path, 0.4), lag=True)
    assert out["completed"] + out["dropped"] == 300
    assert late["ticket"] < prompt["ticket"] - 20  # each ticket held 0.4 s longer
    assert late["ticket"] + late["route"] == prompt["ticket"] + prompt["route"] == 300
    again, late_again = _ascendra(_profile(tmp_path, 0.4), lag=True)
    assert (late_again, again["ttft_p99"]) == (late, out["ttft_p99"])  # deterministic


def test_a_lag_moves_only_the_controllers_view_not_the_reported_token_times(
        tmp_path: Path) -> None:
    """With a lag of zero the reports arrive at once: the same tickets and times."""
    base, causes = _ascendra(_profile(tmp_path, 0.0), lag=False)
    zero, zero_causes = _ascendra(_profile(tmp_path, 0.0), lag=True)
    assert zero_causes == causes
    assert (zero["ttft_p50"], zero["ttft_p99"], zero["tbt_p99"]) == (
        base["ttft_p50"], base["ttft_p99"], base["tbt_p99"])


def test_an_older_state_arriving_after_a_newer_one_is_not_applied() -> None:
    lag = ControllerLag(OverheadProfile((0.0,), delivery_s=(0.1,)), seed=0, instances=2)
    assert lag.arrival(1.0) == pytest.approx(1.1)
    assert lag.newer(0, 2.0)
    assert not lag.newer(0, 1.5)  # made before the one the controller holds
    assert lag.newer(1, 1.5)  # another instance's own order
    assert lag.newer(0, 2.0)


def test_controller_lag_needs_a_profile_with_delivery_samples(tmp_path: Path) -> None:
    cfg = SimConfig(policy="ascendra", instances=3, hp_instances=1, controller_lag=True)
    with pytest.raises(ValueError, match=r"controller_lag \(--controller-lag\).*--overhead-pr"):
        cfg.validate()
    with pytest.raises(ValueError, match=r"controller_lag \(--controller-lag\).*no delivery"):
        _ascendra(_profile(tmp_path, None), lag=True)
