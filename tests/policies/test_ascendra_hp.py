"""Ascendra HP instance (§6): prefill first, FCFS, elastic batch, never offloads."""

from __future__ import annotations

from helpers import make_instance, req

from sloserve.instance import Instance


def hp(num_blocks: int = 1000, **knobs: object) -> Instance:
    return make_instance("ascendra-hp", num_blocks=num_blocks, role="hp", **knobs)


def test_prefers_a_waiting_prefill_over_running_decodes() -> None:
    inst = hp()
    inst.add_request(req("dec", 10, output=50), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    inst.add_request(req("new", 100, arrival=0.01), 0.01)
    plan, _, _ = inst.schedule(0.01)
    assert [(i.request_id, i.num_tokens, i.is_prefill) for i in plan.items] == [("new", 100, True)]
    inst.complete(plan, 0.02)
    plan, _, _ = inst.schedule(0.02)  # no prefill left: decode-only
    assert sorted(i.request_id for i in plan.items) == ["dec", "new"]
    assert not any(i.is_prefill for i in plan.items)


def test_admits_prefills_fcfs_whole_and_within_the_worst_batch_tokens() -> None:
    inst = hp(hp_worst_batch_tokens=2048)
    for i, p in enumerate((1000, 900, 300, 10)):
        inst.add_request(req(f"r{i}", p, arrival=0.1 * i, ttft=10.0 - i), 0.0)
    plan, _, _ = inst.schedule(0.0)
    assert [(i.request_id, i.num_tokens) for i in plan.items] == [("r0", 1000), ("r1", 900)]
    inst = hp(hp_worst_batch_tokens=2048)
    inst.add_request(req("long", 3000), 0.0)
    inst.add_request(req("short", 10, arrival=0.1), 0.0)
    plan, _, _ = inst.schedule(0.0)
    assert [(i.request_id, i.num_tokens) for i in plan.items] == [("long", 3000)]


def test_never_offloads_even_hopeless_requests() -> None:
    inst = hp(num_blocks=100, offload_threshold=1e9)
    for i in range(20):
        inst.add_request(req(f"r{i}", 200, output=20, ttft=0.001), 0.0)
    now = 0.0
    while inst.has_work:
        plan, offloaded, dropped = inst.schedule(now)
        assert offloaded == [] and dropped == [] and plan.offloaded == []
        now += 0.01
        inst.complete(plan, now)


def test_elastic_admission_reserves_expected_decodes_but_never_more_than_free_fraction() -> None:
    # 100 blocks of 16. Each request: 160-token prompt (10 blocks) + an expected 320-token
    # decode (20 blocks). A full reservation (fraction 1.0) admits 3 (90 of 100); §8.5's
    # rule keeps at most 10% (10 blocks) free: 9 admitted (90 + 10 = 100).
    for fraction, admitted in ((1.0, 3), (0.1, 9)):
        inst = hp(num_blocks=100, hp_decode_len_prior=320.0, hp_free_kv_fraction=fraction)
        for i in range(12):
            inst.add_request(req(f"r{i}", 160, output=1000, arrival=0.1 * i), 0.0)
        plan, _, _ = inst.schedule(0.0)
        assert [i.request_id for i in plan.items] == [f"r{i}" for i in range(admitted)]
    inst = hp(num_blocks=100, hp_decode_len_prior=320.0, hp_elastic=False)  # §8.5 ablation
    for i in range(12):
        inst.add_request(req(f"r{i}", 160, output=1000, arrival=0.1 * i), 0.0)
    plan, _, _ = inst.schedule(0.0)
    assert len(plan.items) == 9  # no reservation; vLLM's 1% watermark stops the 10th


def test_an_offload_waits_at_most_one_batch_behind_long_running_decodes() -> None:
    # §6.1: a ticketed request decodes on HP for its whole life; its expected decode
    # (1500 tokens: 93 more blocks) plus the offload (20) exceed the 99 blocks free, yet
    # the offload is admitted at the very next iteration since >= 10% of KV stays free.
    inst = hp(num_blocks=150, hp_decode_len_prior=2000.0)
    inst.add_request(req("ticketed", 800, output=1500), 0.0)  # 50 blocks
    now = 0.0
    for _ in range(3):
        plan, _, _ = inst.schedule(now)
        now += 0.01
        inst.complete(plan, now)
    inst.add_request(req("offload", 320, arrival=now, ttft=0.2), now)  # 20 blocks
    plan, _, _ = inst.schedule(now)
    assert [(i.request_id, i.is_prefill) for i in plan.items] == [("offload", True)]


def test_offers_a_ticket_only_while_kv_beyond_expected_decodes_exceeds_the_free_fraction() -> None:
    # §6.1 + §8.5: 100 blocks; after its prefill and first token each running request
    # holds 10 blocks and expects 19 more (a 320-token decode). Two running: 80 - 38 = 42
    # blocks free after decodes > 10: a ticket. Four: 60 - 76 < 10: none, room kept for offloads.
    for running, offers in ((2, True), (4, False)):
        inst = hp(num_blocks=100, hp_decode_len_prior=320.0)
        for i in range(running):
            inst.add_request(req(f"r{i}", 160, output=1000, arrival=0.1 * i), 0.0)
        plan, _, _ = inst.schedule(0.0)
        inst.complete(plan, 0.01)
        assert inst.policy.offers_ticket(inst.view(0.01)) is offers, running


def test_decode_reservation_follows_the_observed_output_lengths() -> None:
    inst = hp()
    for i, out in enumerate((2, 4)):
        inst.add_request(req(f"r{i}", 16, output=out, arrival=0.1 * i), 0.0)
    now = 0.0
    while inst.has_work:
        plan, _, _ = inst.schedule(now)
        now += 0.01
        inst.complete(plan, now)
    assert inst.policy.mean_decode_len == 3.0  # type: ignore[attr-defined]


def test_drop_late_drops_only_waiting_requests_past_their_ttft_deadline() -> None:
    for drop_late, expect in ((True, ["late"]), (False, [])):
        inst = hp(drop_late=drop_late)
        inst.add_request(req("late", 10, arrival=0.0, ttft=0.5), 0.0)
        inst.add_request(req("on_time", 10, arrival=0.0, ttft=2.0), 0.0)
        inst.add_request(req("no_slo", 10, arrival=0.0, ttft=None), 0.0)
        plan, _, dropped = inst.schedule(1.0)
        assert [r.request_id for r in dropped] == expect, drop_late
        assert "on_time" in {i.request_id for i in plan.items}
