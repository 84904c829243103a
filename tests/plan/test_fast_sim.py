"""BestServe fast simulators (§3.4, Algorithms 2-7)."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.plan.estimator import Estimator
from sloserve.plan.fast_sim import (
    Requests,
    decode_time,
    kv_transfer_time,
    pseudo_batch_size,
    simulate_collocated,
    simulate_decode,
    simulate_disaggregated,
    simulate_prefill,
)

EST = Estimator(get_model("llama-2-7b"), get_hardware("a100"))
S, OUT = 1024, 32


def _reqs(arrivals: list[float], s: int = S, o: int = OUT) -> Requests:
    n = len(arrivals)
    return Requests(np.array(arrivals), np.full(n, s), np.full(n, o))


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.mark.parametrize(("b", "expected"), [(0, 1), (1, 1), (4, 2), (9, 4), (15, 6)])
def test_pseudo_batch_size_eq_9(b: int, expected: int) -> None:
    assert pseudo_batch_size(b, 2.5) == expected


def test_prefill_batches_what_has_arrived_up_to_max_batch() -> None:
    dep = simulate_prefill(EST, _reqs([0.0, 0.0, 0.0]), instances=1, max_batch=2,
                           max_tokens=8192, rng=_rng())
    t2 = EST.estimate_time(2, S, 0, "prefill")
    t1 = EST.estimate_time(1, S, 0, "prefill")
    assert dep == pytest.approx([t2, t2, t2 + t1])


def test_prefill_token_cap_splits_batches() -> None:
    dep = simulate_prefill(EST, _reqs([0.0, 0.0]), instances=1, max_batch=8,
                           max_tokens=S, rng=_rng())
    t1 = EST.estimate_time(1, S, 0, "prefill")
    assert dep == pytest.approx([t1, 2 * t1])


def test_prefill_uses_idle_second_instance() -> None:
    dep = simulate_prefill(EST, _reqs([0.0, 0.001]), instances=2, max_batch=1,
                           max_tokens=8192, rng=_rng())
    t1 = EST.estimate_time(1, S, 0, "prefill")
    assert dep == pytest.approx([t1, 0.001 + t1])


def test_decode_waits_for_a_free_box_and_uses_pseudo_batch() -> None:
    reqs = _reqs([0.0, 0.0, 0.0])
    dep = simulate_decode(EST, np.zeros(3), reqs, instances=1, slots=2, rng=_rng())
    alone = decode_time(EST, 0, S, OUT, 2.5)
    assert dep[0] == pytest.approx(alone)
    assert dep[1] == pytest.approx(decode_time(EST, 1, S, OUT, 2.5))  # b† = floor(2/2.5) -> 1
    assert dep[2] == pytest.approx(min(dep[0], dep[1]) + decode_time(EST, 1, S, OUT, 2.5))


def test_decode_time_counts_o_minus_one_steps_at_final_context() -> None:
    step = EST.estimate_time(2, S, OUT - 1, "decode")
    assert decode_time(EST, 4, S, OUT, 2.5) == pytest.approx((OUT - 1) * step)
    assert decode_time(EST, 4, S, 1, 2.5) == 0.0


def test_disaggregated_ttft_is_prefill_and_tpot_includes_kv_transfer() -> None:
    reqs = _reqs([0.0])
    lat = simulate_disaggregated(EST, EST, reqs, 1, 1, 8, 8, 8192, _rng())
    prefill = EST.estimate_time(1, S, 0, "prefill")
    transfer = float(kv_transfer_time(EST, np.array([S]))[0])
    assert lat.ttft[0] == pytest.approx(prefill)
    assert lat.tpot[0] == pytest.approx((transfer + decode_time(EST, 0, S, OUT, 2.5)) / (OUT - 1))


def test_collocated_prefill_suspends_running_decode() -> None:
    prefill = EST.estimate_time(1, S, 0, "prefill")
    dec = decode_time(EST, 0, S, OUT, 2.5)
    second = prefill + dec / 2  # arrives while request 0 decodes
    lat = simulate_collocated(EST, _reqs([0.0, second]), 1, 8, 8, 8192, _rng())
    assert lat.ttft[0] == pytest.approx(prefill)
    assert lat.ttft[1] == pytest.approx(prefill)  # prefill goes first
    # request 0's decode was suspended for the whole second prefill
    assert lat.tpot[0] * (OUT - 1) == pytest.approx(dec + prefill)


def test_collocated_decode_waits_for_running_prefill() -> None:
    t2 = EST.estimate_time(1, S, 0, "prefill")
    lat = simulate_collocated(EST, _reqs([0.0, 1e-6]), 1, 1, 8, 8192, _rng())
    # request 1 prefills right after request 0's, before request 0 may decode
    assert lat.ttft[1] == pytest.approx(2 * t2 - 1e-6)
    assert lat.tpot[0] * (OUT - 1) == pytest.approx(t2 + decode_time(EST, 1, S, OUT, 2.5))


def test_collocated_seq_cap_moves_overload_into_ttft() -> None:
    reqs = _reqs(list(np.linspace(0, 0.5, 40)))
    free = simulate_collocated(EST, reqs, 1, 8, 4, 8192, _rng(), seq_cap=False)
    capped = simulate_collocated(EST, reqs, 1, 8, 4, 8192, _rng(), seq_cap=True)
    assert capped.p90()[0] > free.p90()[0]
    assert capped.p90()[1] < free.p90()[1]


def test_simulators_are_deterministic_for_a_seed() -> None:
    arr = np.cumsum(np.random.default_rng(1).exponential(0.05, 200))
    reqs = _reqs(list(arr))
    a = simulate_collocated(EST, reqs, 3, 8, 16, 8192, np.random.default_rng(7))
    b = simulate_collocated(EST, reqs, 3, 8, 16, 8192, np.random.default_rng(7))
    assert np.array_equal(a.ttft, b.ttft) and np.array_equal(a.tpot, b.tpot)


def test_requests_reject_unsorted_arrivals() -> None:
    with pytest.raises(ValueError, match="sorted"):
        _reqs([1.0, 0.0])
