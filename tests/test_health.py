"""Hang deadlines (``sloserve.health``): factor x calibrated prediction + slack."""

from __future__ import annotations

import pytest

from sloserve.health import HangDeadline


def test_the_deadline_is_factor_times_predicted_plus_slack() -> None:
    h = HangDeadline(factor=2.0, slack_s=1.0)
    assert h.deadline(0.05) == pytest.approx(1.1)
    assert h.deadline(0.05) <= 3 * 0.05 + 1.0  # the acceptance line


def test_an_executor_slower_than_predicted_widens_its_deadline_a_faster_one_does_not() -> None:
    h = HangDeadline(factor=2.0, slack_s=1.0)
    for _ in range(100):
        h.observe(0.05, 0.4)  # 8x the prediction (a roofline before its fit, --time-scale 8)
    assert h.expected(0.05) == pytest.approx(0.4, rel=0.01)
    assert h.deadline(0.05) == pytest.approx(1.8, rel=0.01)
    fast = HangDeadline()
    for _ in range(100):
        fast.observe(0.05, 0.01)
    assert fast.deadline(0.05) == pytest.approx(1.1)


def test_bad_settings_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="hang_factor"):
        HangDeadline(factor=0.5)
    with pytest.raises(ValueError, match="hang_slack_s"):
        HangDeadline(slack_s=float("nan"))


def test_a_missed_deadline_widens_the_next_and_good_batches_narrow_it_again() -> None:
    h = HangDeadline(factor=2.0, slack_s=1.0)
    h.widen()
    h.widen()
    assert h.deadline(1.0) == pytest.approx(2.0 * 4.0 + 1.0)  # 4x the pace after two misses
    for _ in range(200):
        h.observe(1.0, 1.0)
    assert h.deadline(1.0) == pytest.approx(3.0, rel=0.01)
