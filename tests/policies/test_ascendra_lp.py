"""Ascendra LP instance (§5): value-function order, piggybacked decodes, offloading, drop."""

from __future__ import annotations

import random

from helpers import make_instance, make_policy, req

from sloserve.batch import BatchShape
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.base import InstanceView
from sloserve.request import Request

# A slow, fixed model: 0.02 s + 1 ms per token. With a 256-token budget and no
# decodes one LP iteration takes 0.276 s; the worst HP batch (1024 tokens) 1.044 s.
SLOW = LinearPerfModel(base=0.02, per_token=0.001, per_ctx=0.0)


def slow_lp(**knobs: object) -> Instance:
    knobs = {"token_budget": 256, "hp_worst_batch_tokens": 1024, **knobs}
    return Instance("lp0", make_policy("ascendra-lp", **knobs), BlockManager(1000, 16), SLOW)


def test_edf_admits_the_earliest_deadline_not_the_earliest_arrival() -> None:
    for vf, first in (("edf", "urgent"), ("fcfs", "early")):
        inst = make_instance("ascendra-lp", token_budget=100, value_function=vf)
        inst.add_request(req("early", 100, arrival=0.0, ttft=5.0), 0.0)
        inst.add_request(req("urgent", 100, arrival=0.1, ttft=1.0), 0.1)
        plan, _, _ = inst.schedule(0.1)
        assert [i.request_id for i in plan.items] == [first], vf


def test_every_running_decode_is_piggybacked_before_any_prefill() -> None:
    inst = make_instance("ascendra-lp", token_budget=64)
    for i in range(3):
        inst.add_request(req(f"d{i}", 10, output=50), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    inst.add_request(req("big", 500, arrival=0.01, ttft=0.02), 0.01)  # most urgent of all
    plan, _, _ = inst.schedule(0.01)
    by_id = {i.request_id: i for i in plan.items}
    assert all(by_id[f"d{i}"].num_tokens == 1 and not by_id[f"d{i}"].is_prefill for i in range(3))
    assert by_id["big"].num_tokens == 64 - 3  # the prefill gets only what the decodes left


def test_never_exceeds_the_token_budget() -> None:
    rng = random.Random(7)
    inst = make_instance("ascendra-lp", num_blocks=4000, token_budget=128, lp_max_num_seqs=16)
    for i in range(40):
        inst.add_request(req(f"r{i}", rng.randint(1, 600), output=rng.randint(1, 30),
                             arrival=0.0, ttft=rng.uniform(0.1, 3.0)), 0.0)
    now = 0.0
    while inst.has_work:
        plan, _, _ = inst.schedule(now)
        assert 0 < plan.num_tokens <= 128
        assert len(plan.items) <= 16
        now += 0.01
        inst.complete(plan, now)


def test_offloads_a_request_projected_to_miss_ttft_and_keeps_the_others() -> None:
    inst = slow_lp()
    inst.add_request(req("runs", 256, ttft=0.3), 0.0)  # fills this iteration: done at 0.276
    inst.add_request(req("misses", 256, ttft=0.5), 0.0)  # two iterations: 0.552 > 0.5
    inst.add_request(req("makes_it", 256, ttft=0.6), 0.0)  # near its SLO but 0.552 <= 0.6
    plan, offloaded, _ = inst.schedule(0.0)
    assert [i.request_id for i in plan.items] == ["runs"]
    assert [r.request_id for r in offloaded] == ["misses"]
    assert "makes_it" in inst.requests and "misses" not in inst.requests


def test_offload_slack_covers_the_hp_wait_plus_the_requests_own_prefill() -> None:
    # §5.3: "far" misses on LP (256 + 2048 tokens = 9 iterations = 2.484 s > 2.45 s). On HP
    # it may wait for one worst batch (1024 tokens: 1.044 s) and then runs its own prefill
    # (2048 tokens: 2.068 s): 3.112 s >= its 2.45 s slack, so it leaves now (threshold 1);
    # with threshold 0.75 (2.334 s) not yet. One worst batch alone (2.068 s) would keep it.
    for threshold, expect in ((0.75, []), (1.0, ["far"])):
        inst = slow_lp(offload_threshold=threshold)
        inst.add_request(req("runs", 256, ttft=0.3), 0.0)
        inst.add_request(req("far", 2048, ttft=2.45), 0.0)
        _, offloaded, _ = inst.schedule(0.0)
        assert [r.request_id for r in offloaded] == expect, threshold


def test_never_offloads_a_request_whose_prefill_has_started() -> None:
    inst = slow_lp()
    inst.add_request(req("started", 2048, ttft=0.5), 0.0)
    plan, _, _ = inst.schedule(0.0)  # first 256-token chunk
    inst.complete(plan, 0.276)
    inst.add_request(req("queued", 256, arrival=0.276, ttft=0.3), 0.276)  # waiting, same fate
    plan, offloaded, _ = inst.schedule(0.3)
    assert [r.request_id for r in offloaded] == ["queued"]  # the rule fires here...
    assert [i.request_id for i in plan.items] == ["started"]  # ...but never on a started prefill
    assert inst.requests["started"].prefill_started


def test_never_offloads_a_started_prefill_even_when_decodes_leave_it_no_budget() -> None:
    kv = BlockManager(1000, 16)
    started = req("started", 2048, ttft=0.5)
    started.num_computed = 256
    kv.allocate("started", 256)
    decodes = []
    for i in range(4):
        d = req(f"d{i}", 16, output=50)
        d.num_computed, d.num_generated = 16, 1
        kv.allocate(d.request_id, 16)
        decodes.append(d)
    queued = req("queued", 256, arrival=0.2, ttft=0.3)
    policy = make_policy("ascendra-lp", token_budget=4, hp_worst_batch_tokens=1024)
    view = InstanceView("lp0", 0.3, [queued], [started, *decodes], kv, SLOW)
    plan = policy.schedule(view)
    assert sorted(i.request_id for i in plan.items) == ["d0", "d1", "d2", "d3"]
    assert plan.offloaded == ["queued"]  # the rule fires, but not for the started prefill


def test_threshold_zero_disables_offloading_and_late_requests_are_not_offloaded() -> None:
    inst = slow_lp(offload_threshold=0.0)
    inst.add_request(req("runs", 256, ttft=0.3), 0.0)
    inst.add_request(req("misses", 256, ttft=0.5), 0.0)
    assert inst.schedule(0.0)[1] == []
    inst = slow_lp(offload_threshold=100.0)
    inst.add_request(req("runs", 256, ttft=0.05), 0.0)  # earliest deadline: admitted
    inst.add_request(req("already_late", 256, ttft=0.1), 0.0)
    inst.add_request(req("misses", 256, ttft=0.2), 0.0)
    _, offloaded, _ = inst.schedule(0.15)
    assert [r.request_id for r in offloaded] == ["misses"]


def test_drop_late_drops_only_waiting_requests_past_their_own_ttft_deadline() -> None:
    for drop_late, expect in ((True, ["late"]), (False, [])):
        inst = make_instance("ascendra-lp", token_budget=64, drop_late=drop_late,
                             offload_threshold=0.0)
        inst.add_request(req("started", 300, ttft=0.5), 0.0)
        plan, _, _ = inst.schedule(0.0)
        inst.complete(plan, 0.1)
        inst.add_request(req("late", 10, arrival=0.0, ttft=0.5), 0.1)
        inst.add_request(req("on_time", 10, arrival=0.0, ttft=2.0), 0.1)
        inst.add_request(req("no_slo", 10, arrival=0.0, ttft=None), 0.1)
        given = req("given", 10, arrival=0.0, ttft=0.5)  # the deployment's TTFT (issue 35)
        given.slo.defaulted = frozenset({"ttft"})
        inst.add_request(given, 0.1)
        resumed = req("resumed", 10, arrival=0.0, ttft=0.5)  # first token already out
        resumed.num_generated, resumed.token_times = 2, [0.2, 0.3]
        inst.add_request(resumed, 0.1)
        _, _, dropped = inst.schedule(1.0)  # "started", "resumed": past it but TTFT settled
        assert [r.request_id for r in dropped] == expect, drop_late


def test_algorithm1_admits_whole_prefills_within_token_budget_n_and_breaks_at_a_misfit() -> None:
    # N = 300: "a" fits whole, "b" would need a chunk, so admission stops there (Alg. 1's
    # break) rather than Sarathi's fill-the-budget chunking; "c" is never looked at.
    inst = make_instance("ascendra-lp", token_budget=300, offload_threshold=0.0)
    inst.add_request(req("a", 200, ttft=1.0), 0.0)
    inst.add_request(req("b", 200, ttft=2.0), 0.0)
    inst.add_request(req("c", 50, ttft=3.0), 0.0)
    plan, _, _ = inst.schedule(0.0)
    assert [(i.request_id, i.num_tokens) for i in plan.items] == [("a", 200)]
    # a prompt longer than N can never fit whole: as the head it runs in N-token chunks
    inst = make_instance("ascendra-lp", token_budget=300, offload_threshold=0.0)
    inst.add_request(req("long", 700, ttft=1.0), 0.0)
    plan, _, _ = inst.schedule(0.0)
    assert [(i.request_id, i.num_tokens) for i in plan.items] == [("long", 300)]


def decoding_view(waiting: list, tbt: float) -> InstanceView:
    kv = BlockManager(1000, 16)
    running = []
    for i in range(3):
        d = req(f"d{i}", 16, output=50, tbt=tbt)
        d.num_computed, d.num_generated = 16, 1
        kv.allocate(d.request_id, 16)
        running.append(d)
    return InstanceView("lp0", 0.0, waiting, running, kv, SLOW)


def test_algorithm1_compute_budget_c_is_the_decodes_tbt_slo_under_the_regression() -> None:
    # SLOW: 0.02 s + 1 ms/token. Three decodes with a 0.1005 s TBT SLO leave C room for
    # 77 prefill tokens (0.02 + 0.080 = 0.1 s): "p" (100) cannot run whole, so as the head
    # it gets a 77-token chunk; "q" then breaks admission although N has room for it.
    policy = make_policy("ascendra-lp", token_budget=2048, offload_threshold=0.0)
    view = decoding_view([req("p", 100, ttft=5.0), req("q", 10, ttft=6.0)], tbt=0.1005)
    plan = policy.schedule(view)
    assert sorted((i.request_id, i.num_tokens) for i in plan.items) == [
        ("d0", 1), ("d1", 1), ("d2", 1), ("p", 77)]
    # a looser TBT SLO (C = 0.2 s) fits both whole
    policy = make_policy("ascendra-lp", token_budget=2048, offload_threshold=0.0)
    plan = policy.schedule(decoding_view([req("p", 100, ttft=5.0), req("q", 10, ttft=6.0)],
                                         tbt=0.2))
    assert sorted((i.request_id, i.num_tokens) for i in plan.items) == [
        ("d0", 1), ("d1", 1), ("d2", 1), ("p", 100), ("q", 10)]


def test_lp_admits_by_slack_not_arrival_when_slos_are_uniform() -> None:
    # §3.3 end to end: same 1 s TTFT SLO; the later, longer prompt has less slack
    inst = slow_lp(token_budget=2048, offload_threshold=0.0)
    inst.add_request(req("short", 100, arrival=0.0, ttft=1.0), 0.0)
    inst.add_request(req("long", 900, arrival=0.05, ttft=1.0), 0.05)
    plan, _, _ = inst.schedule(0.05)
    assert [i.request_id for i in plan.items][0] == "long"


def test_edf_offload_scan_stops_early_without_missing_any_offload() -> None:
    # The heap scan stops at the first request whose slack rules it out; a full scan of
    # the same rule over the EDF order (written out here) must find the same offloads.
    rng = random.Random(3)
    for trial in range(20):
        theta = rng.choice((0.5, 1.0, 2.0, 3.0))
        waiting = [req(f"w{i}", rng.randint(16, 3000), arrival=rng.uniform(0.0, 2.0),
                       ttft=rng.uniform(0.5, 4.0)) for i in range(40)]
        policy = make_policy("ascendra-lp", token_budget=256, hp_worst_batch_tokens=1024,
                             offload_threshold=theta)
        now = 2.0
        view = InstanceView("lp0", now, waiting, [], BlockManager(100_000, 16), SLOW)
        plan = policy.schedule(view)
        admitted = {i.request_id for i in plan.items}

        def phi(r: Request) -> float:
            return SLOW.predict(BatchShape(prefills=((r.prompt_len, 0),)))

        order = sorted(waiting, key=lambda r: (r.arrival_time + r.slo.ttft - phi(r),
                                               r.arrival_time))
        t_iter = SLOW.predict(BatchShape(prefills=((256, 0),)))
        t_worst = SLOW.predict(BatchShape(prefills=((1024, 0),)))
        queued, expect = sum(r.prompt_len for r in order if r.request_id in admitted), []
        for r in order:
            if r.request_id in admitted:
                continue
            queued += r.prompt_len
            d = r.arrival_time + r.slo.ttft
            if (now < d and d - now <= theta * (t_worst + phi(r))
                    and now + t_iter * -(-queued // 256) > d):
                expect.append(r.request_id)
                queued -= r.prompt_len
        assert sorted(plan.offloaded) == sorted(expect), trial
