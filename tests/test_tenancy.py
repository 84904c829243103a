"""Per-key limits (``sloserve.tenancy``): in-flight bound and token bucket (issue 36, item 7)."""

from __future__ import annotations

import pytest

from sloserve.tenancy import INFLIGHT_RETRY_S, KeyLimits, TenantLimiter


def test_a_key_over_its_inflight_bound_is_refused_and_other_keys_are_not() -> None:
    lim = TenantLimiter(KeyLimits(max_inflight=2))
    assert lim.acquire("a", 100, 0.0) is None and lim.acquire("a", 100, 0.0) is None
    why = lim.acquire("a", 100, 0.0)
    assert why is not None and "max_inflight_per_key 2" in why.reason
    assert why.retry_after_s == INFLIGHT_RETRY_S
    assert lim.acquire("b", 100, 0.0) is None  # another key has its own slots
    lim.release("a")
    assert lim.acquire("a", 100, 0.0) is None  # a slot came back


def test_the_token_bucket_refills_at_its_rate_and_says_when_to_retry() -> None:
    lim = TenantLimiter(KeyLimits(token_rate=100.0, token_burst=1000.0))
    assert lim.acquire("a", 600, 0.0) is None  # a first request finds the bucket full
    why = lim.acquire("a", 600, 0.0)  # 400 left
    assert why is not None and "key_token_rate 100/s" in why.reason
    assert why.retry_after_s == pytest.approx(2.0)  # 200 tokens short at 100/s
    assert lim.acquire("a", 600, 1.9) is not None  # a refusal takes nothing
    assert lim.acquire("a", 600, 2.0) is None
    assert lim.acquire("b", 600, 2.0) is None  # another key: its own bucket


def test_a_request_bigger_than_the_bucket_waits_for_a_full_bucket_then_goes_into_debt() -> None:
    lim = TenantLimiter(KeyLimits(token_rate=100.0, token_burst=500.0))
    assert lim.acquire("a", 800, 0.0) is None  # full bucket: admitted, 300 in debt
    lim.release("a")
    why = lim.acquire("a", 100, 0.0)
    assert why is not None and why.retry_after_s == pytest.approx(4.0)  # -300 -> 100
    assert lim.acquire("a", 100, 4.0) is None  # the long-run rate holds


def test_bad_limits_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="max_inflight_per_key"):
        KeyLimits(max_inflight=-1)
    with pytest.raises(ValueError, match="key_token_rate"):
        KeyLimits(token_rate=float("nan"))
    with pytest.raises(ValueError, match="key_token_burst"):
        KeyLimits(token_burst=-5.0)
    assert not KeyLimits().on and KeyLimits(token_rate=1.0).burst == 10.0
