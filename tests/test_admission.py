"""Admission control (``sloserve.admission``): bounded queues and SLO-aware shedding."""

from __future__ import annotations

import dataclasses

import pytest

from sloserve.admission import Admission, Pace, for_deployment, predicted_ttft, refusal
from sloserve.batch import BatchShape
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.policies import get_spec
from sloserve.policies.sarathi import SarathiConfig
from sloserve.request import SLO, Request, RequestStatus
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation


class PerToken:
    """0.1 ms per batched token: a perf model whose predictions are easy to follow."""

    def predict(self, shape: BatchShape) -> float:
        return 1e-4 * shape.num_tokens


def instance() -> Instance:
    policy = get_spec("sarathi").make("lp", SarathiConfig(token_budget=512), num_hp=0)
    return Instance("lp0", policy, BlockManager(4096, 16), PerToken())


def req(rid: str, prompt: int = 100, ttft: float | None = 10.0, at: float = 0.0) -> Request:
    return Request(rid, at, prompt, 8, SLO(ttft=ttft))


def test_a_full_request_queue_refuses_new_requests_naming_the_bound() -> None:
    inst = instance()
    for k in range(3):
        inst.add_request(req(f"r{k}"), 0.0)
    limits = Admission(max_queued_requests=3, shed_late=False)
    assert refusal(inst, req("new"), 0.0, limits) == (
        "shed: lp0 has 3 requests queued (max_queued_requests 3)")
    assert refusal(inst, req("new"), 0.0, Admission(max_queued_requests=4)) is None
    assert refusal(inst, req("new"), 0.0, Admission(max_queued_requests=0)) is None  # off


def test_a_full_token_queue_refuses_a_prompt_that_would_overflow_it() -> None:
    inst = instance()
    inst.add_request(req("a", prompt=900), 0.0)
    limits = Admission(max_queued_tokens=1000, shed_late=False)
    assert refusal(inst, req("fits", prompt=100), 0.0, limits) is None
    why = refusal(inst, req("big", prompt=101), 0.0, limits)
    assert why is not None and "max_queued_tokens 1000" in why and "900 prefill tokens" in why


def test_a_request_predicted_to_miss_its_ttft_is_shed_and_one_that_fits_is_not() -> None:
    inst = instance()
    for k in range(10):  # 10 x 512 tokens ahead: 10 iterations of 51.2 ms
        inst.add_request(req(f"q{k}", prompt=512), 0.0)
    t = predicted_ttft(inst, req("x", prompt=512), 0.0)
    assert t == pytest.approx(11 * 0.0512)
    assert refusal(inst, req("late", prompt=512, ttft=0.5), 0.0, Admission()) is not None
    assert refusal(inst, req("ok", prompt=512, ttft=0.6), 0.0, Admission()) is None
    # time already spent waiting counts against the SLO
    assert refusal(inst, req("old", prompt=512, ttft=0.6, at=-0.1), 0.0, Admission()) is not None
    assert refusal(inst, req("no-slo", prompt=512, ttft=None), 0.0, Admission()) is None
    assert refusal(inst, req("late", prompt=512, ttft=0.5), 0.0,
                   Admission(shed_late=False)) is None


def test_a_slow_host_pace_stretches_the_prediction_and_sheds_what_would_miss() -> None:
    """Issue 36, item 3: iterations that take longer on the wall clock than predicted
    (a busy host) make the shed decision scale the queue ahead by the measured pace."""
    inst = instance()
    for k in range(10):
        inst.add_request(req(f"q{k}", prompt=512), 0.0)
    pace = Pace()
    for _ in range(200):  # each result 1.5x its prediction after the previous one
        pace.observe(0.0512, 1.5 * 0.0512)
    assert pace.ratio == pytest.approx(1.5, rel=1e-6)
    t = predicted_ttft(inst, req("x", prompt=512), 0.0, pace.ratio)
    assert t == pytest.approx(1.5 * 11 * 0.0512, rel=1e-6)
    ok = req("ok", prompt=512, ttft=0.6)  # fits at the perf model's pace, not at 1.5x
    assert refusal(inst, ok, 0.0, Admission()) is None
    assert refusal(inst, ok, 0.0, Admission(), pace.ratio) is not None
    # time already waited is wall time: not scaled
    assert predicted_ttft(inst, req("old", prompt=512, at=-1.0), 0.0, 2.0) == \
        pytest.approx(1.0 + 2 * 11 * 0.0512)


def test_pace_never_goes_below_the_perf_model_and_ignores_nonsense() -> None:
    pace = Pace()
    for _ in range(50):
        pace.observe(0.1, 0.05)  # faster than predicted: still 1 (never optimistic)
    assert pace.ratio == 1.0
    for bad in (float("nan"), float("inf"), -1.0):
        pace.observe(0.1, bad)
    pace.observe(0.0, 1.0)  # no prediction: nothing to compare
    assert pace.ratio == 1.0


def test_running_decodes_shrink_the_prefill_chunk_and_delay_the_first_token() -> None:
    inst = instance()
    inst.add_request(req("d", prompt=16), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)  # "d" has its first token: a running decode
    t = predicted_ttft(inst, req("x", prompt=1022), 0.0)
    # the batch under way, then 1022 tokens in chunks of 511 beside one decode
    assert t == pytest.approx(3 * 512e-4)


def test_bad_limits_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="max_queued_requests"):
        Admission(max_queued_requests=-1)
    with pytest.raises(ValueError, match="max_queued_tokens"):
        Admission(max_queued_tokens=1.5)  # type: ignore[arg-type]


def test_at_three_times_capacity_admitted_requests_keep_their_slos_in_simulation() -> None:
    """sarathi, A100, ShareGPT: goodput capacity is 2.25 req/s (find_capacity, 400 requests,
    seed 1); at 3x that, admission sheds what cannot make it and the admitted keep goodput."""
    cfg = SimConfig(policy="sarathi", num_requests=300, seed=1, qps=6.75)
    sims = {}
    for name, adm in (("none", None), ("admission", Admission())):
        sim = Simulation(dataclasses.replace(cfg, admission=adm))
        sim.run()
        sims[name] = sim
    reqs = list(sims["admission"].requests.values())
    admitted = [r for r in reqs if r.status is not RequestStatus.DROPPED]
    good = [r for r in admitted if r.ttft is not None and r.ttft <= 1.0
            and (r.mean_tbt is None or r.mean_tbt <= 0.15)]
    assert 0 < len(admitted) < len(reqs)  # some shed, most not
    assert len(good) / len(admitted) >= 0.9
    plain = list(sims["none"].requests.values())
    plain_good = [r for r in plain if r.ttft is not None and r.ttft <= 1.0]
    assert len(plain_good) / len(plain) < 0.5  # without it, queueing ruins most TTFTs


def test_with_hp_instances_the_ttft_test_is_left_to_the_policy_and_the_bounds_stay() -> None:
    limits = for_deployment(Admission(max_queued_requests=7), num_hp=1)
    assert (limits.shed_late, limits.max_queued_requests) == (False, 7)
    assert for_deployment(Admission(), num_hp=0) == Admission()


def test_a_default_ttft_slo_is_never_a_reason_to_shed_but_the_queue_bounds_still_are() -> None:
    """Issue 35: a request that did not ask for a TTFT (the deployment filled one in) is
    served however late it is predicted; its own TTFT of the same value is shed."""
    inst = instance()
    for k in range(10):  # 10 x 512 tokens ahead: the first token in 0.56 s
        inst.add_request(req(f"q{k}", prompt=512), 0.0)
    own = Request("own", 0.0, 512, 8, SLO(ttft=0.5))
    given = Request("given", 0.0, 512, 8, SLO(ttft=0.5, defaulted=frozenset({"ttft"})))
    assert refusal(inst, own, 0.0, Admission()) is not None
    assert refusal(inst, given, 0.0, Admission()) is None
    # only the TTFT's origin matters: a defaulted TBT beside an own TTFT still sheds
    tbt_given = Request("t", 0.0, 512, 8, SLO(ttft=0.5, tbt=0.1, defaulted=frozenset({"tbt"})))
    assert refusal(inst, tbt_given, 0.0, Admission()) is not None
    assert refusal(inst, given, 0.0, Admission(max_queued_requests=10)) == (
        "shed: lp0 has 10 requests queued (max_queued_requests 10)")


def test_an_slo_names_only_targets_it_sets_as_defaulted() -> None:
    assert SLO(ttft=1.0, defaulted=frozenset({"ttft"})).own("ttft") is None
    assert SLO(ttft=1.0, tbt=0.1, defaulted=frozenset({"ttft"})).own("tbt") == 0.1
    with pytest.raises(ValueError, match="defaulted: 'tbt'"):
        SLO(ttft=1.0, defaulted=frozenset({"tbt"}))  # no TBT to be a default
    with pytest.raises(ValueError, match="defaulted: 'ttf'"):
        SLO(ttft=1.0, defaulted=frozenset({"ttf"}))
