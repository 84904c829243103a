"""AccelGen §4.3: iteration deadlines, remaining time and JCT → per-iteration slack."""

from __future__ import annotations

import math

import pytest

from sloserve.request import SLO, Request
from sloserve.slo import (
    JctClock,
    JctSlack,
    iteration_slo,
    jct_allowed_wait,
    next_token_deadline,
    remaining_time,
)


def test_jct_allowed_wait_spreads_slack_over_chunks_and_tokens() -> None:
    # N_ck = ceil(1000/512) = 2, S_g = 100, T_max = 0.1: T_e = 2*0.1 + 100*0.1 = 10.2
    assert jct_allowed_wait(100.0, 1000, 100, 512, 0.1) == pytest.approx((100 - 10.2) / 102)
    # preemption: each token may add P_max * P = 1.0 * 0.1 seconds
    got = jct_allowed_wait(100.0, 1000, 100, 512, 0.1, preempt_max=1.0, preempt_prob=0.1)
    assert got == pytest.approx((100 - 20.2) / 102)


def test_jct_allowed_wait_is_negative_when_jct_is_unreachable() -> None:
    assert jct_allowed_wait(1.0, 1000, 100, 512, 0.1) < 0


def test_carry_over_follows_section_4_3() -> None:
    a = JctSlack(per_iteration=1.0)
    late = a.after_wait(1.3)  # d = 0.3 late -> next allowed T_r - d
    assert late.allowed == pytest.approx(0.7)
    again = late.after_wait(0.7 + 0.2)  # runs T_r + d1 with d1 = 0.2 -> T_r - d1
    assert again.allowed == pytest.approx(0.8)
    early = a.after_wait(0.6)  # d = 0.4 early -> T_r + d
    assert early.allowed == pytest.approx(1.4)
    assert early.after_wait(1.4).allowed == pytest.approx(1.0)  # carry used up -> back to T_r


def test_jct_clock_counts_wait_from_last_return() -> None:
    clock = JctClock(JctSlack(0.5), t0=10.0)
    assert clock.remaining_time(10.2) == pytest.approx(0.3)
    clock.start_iteration(10.2)  # waited 0.2 of 0.5: 0.3 carried
    clock.end_iteration(10.3)
    assert clock.slack.allowed == pytest.approx(0.8)
    assert clock.remaining_time(10.3) == pytest.approx(0.8)


def test_remaining_time_uses_ttft_then_tbt() -> None:
    req = Request("r", arrival_time=0.0, prompt_len=1000, output_len=5, slo=SLO(ttft=2.0, tbt=0.2))
    assert iteration_slo(req) == 2.0
    # prefill: deadline 2.0, N_ck = ceil(1000/512) = 2 chunks of T_max 0.1
    assert remaining_time(req, 0.5, t_max=0.1, chunk_len=512) == pytest.approx(1.3)
    req.num_computed, req.num_generated, req.token_times = 1000, 1, [1.5]
    assert iteration_slo(req) == 0.2
    assert next_token_deadline(req) == pytest.approx(1.7)
    assert remaining_time(req, 1.55, t_max=0.05, chunk_len=512) == pytest.approx(0.1)


def test_remaining_time_is_infinite_without_a_target() -> None:
    req = Request("r", arrival_time=0.0, prompt_len=10, output_len=5, slo=SLO(jct=9.0))
    assert next_token_deadline(req) is None
    assert math.isinf(remaining_time(req, 1.0, 0.1, 512))


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="jct_slo"):
        jct_allowed_wait(0.0, 10, 10, 512, 0.1)
    with pytest.raises(ValueError, match="chunk_len"):
        jct_allowed_wait(1.0, 10, 10, 0, 0.1)
    with pytest.raises(ValueError, match="preempt_prob"):
        jct_allowed_wait(1.0, 10, 10, 512, 0.1, preempt_prob=2.0)
