"""The core's instance driver (``sloserve.driver``, issue 32 item 1): one step for all."""

from __future__ import annotations

import pytest
from helpers import make_instance, req

from sloserve.admission import Admission
from sloserve.driver import InstanceDriver, Outcome, ResultMismatch, first_placement
from sloserve.request import RequestStatus


def _running(overlap: bool, output: int = 3) -> tuple[InstanceDriver, list[str]]:
    """A driver whose two requests finished their prefill (first token made)."""
    drv = InstanceDriver(make_instance("sarathi", token_budget=64), overlap=overlap)
    for rid in ("a", "b"):
        drv.instance.add_request(req(rid, 8, output=output), 0.0)
    plan = drv.decide(0.0)[0]
    assert plan is not None
    drv.land(drv.launch(plan, 0.0, 0.01), Outcome(0.01, {"a": 1, "b": 1}))
    return drv, ["a", "b"]


def test_first_placement_is_only_a_fresh_request_dispatched_at_its_arrival() -> None:
    r = req("a", 8, arrival=2.0)
    assert first_placement(r, 2.0)
    assert not first_placement(r, 2.5)  # a re-run after its instance was lost
    r.num_offloads = 1
    assert not first_placement(r, 2.0)  # an offload
    r.num_offloads, r.num_generated = 0, 3
    assert not first_placement(r, 2.0)  # resumed with tokens already made


def test_admission_refuses_a_first_placement_but_never_an_offload() -> None:
    drv = InstanceDriver(make_instance("sarathi", token_budget=64))
    drv.instance.add_request(req("q", 8), 0.0)
    full = Admission(max_queued_requests=1)
    fresh, offloaded = req("f", 8), req("o", 8)
    offloaded.num_offloads = 1
    why = drv.refusal(fresh, 0.0, 0.0, full)
    assert why is not None and "max_queued_requests 1" in why
    assert drv.refusal(offloaded, 0.0, 0.0, full) is None
    assert drv.refusal(fresh, 0.0, 0.0, None) is None  # no admission control


def test_serial_launch_applies_nothing_until_the_result_lands() -> None:
    drv, _ = _running(overlap=False)
    a = drv.instance.requests["a"]
    plan = drv.decide(0.01)[0]
    assert plan is not None
    flight = drv.launch(plan, 0.01, 0.02)
    assert a.num_generated == 1 and flight.events is None
    events = drv.land(flight, Outcome(0.025, {"a": 7, "b": 8}))
    assert a.num_generated == 2 and a.token_times[-1] == 0.025
    assert a.output_token_ids == [1, 7] and [e.token_id for e in events] == [7, 8]


def test_overlap_launch_applies_provisionally_and_land_puts_the_real_end_and_ids() -> None:
    drv, live = _running(overlap=True)
    a = drv.instance.requests["a"]
    plan = drv.decide(0.01)[0]
    assert plan is not None
    flight = drv.launch(plan, 0.01, 0.02)  # applied now, ending when predicted
    assert a.num_generated == 2 and a.token_times[-1] == 0.02
    assert a.output_token_ids == [1]  # the id is not known before the result
    events = drv.land(flight, Outcome(0.03, {"a": 7, "b": 8}), live)
    assert a.token_times[-1] == 0.03 and a.output_token_ids == [1, 7]
    assert [(e.request_id, e.time, e.token_id) for e in events] == [
        ("a", 0.03, 7), ("b", 0.03, 8)]


def test_overlap_land_finishes_a_request_the_executor_stopped_early() -> None:
    drv, live = _running(overlap=True, output=5)
    plan = drv.decide(0.01)[0]
    assert plan is not None
    flight = drv.launch(plan, 0.01, 0.02)
    b = drv.instance.requests["b"]
    used = drv.instance.kv.num_used_blocks
    events = drv.land(flight, Outcome(0.03, {"a": 7, "b": 2}, stopped={"b"}), live)
    assert b.status is RequestStatus.FINISHED and b.finish_time == 0.03
    assert "b" not in drv.instance.requests and drv.instance.kv.num_used_blocks < used
    assert [e.finished for e in events] == [False, True]


def test_overlap_land_without_a_token_the_plan_expects_is_a_mismatch() -> None:
    drv, live = _running(overlap=True)
    plan = drv.decide(0.01)[0]
    assert plan is not None
    with pytest.raises(ResultMismatch, match="no token for b"):
        drv.land(drv.launch(plan, 0.01, 0.02), Outcome(0.03, {"a": 7}), live)


def test_rollback_takes_back_tokens_never_made_and_revives_a_finished_request() -> None:
    drv, live = _running(overlap=True, output=2)  # the next token is the last
    a = drv.instance.requests["a"]
    plan = drv.decide(0.01)[0]
    assert plan is not None
    flight = drv.launch(plan, 0.01, 0.02)
    assert a.status is RequestStatus.FINISHED and "a" not in drv.instance.requests
    drv.rollback(flight, live)
    assert a.num_generated == 1 and a.token_times == [0.01]
    assert (a.status, a.finish_time) == (RequestStatus.RUNNING, None)
    assert drv.instance.requests["a"] is a and a in drv.instance.running


def test_a_simulated_overlap_flight_lands_with_the_events_of_its_launch() -> None:
    drv = InstanceDriver(make_instance("sarathi", token_budget=64), overlap=True,
                         simulated=True)
    drv.instance.add_request(req("a", 8, output=3), 0.0)
    plan = drv.decide(0.0)[0]
    assert plan is not None
    flight = drv.launch(plan, 0.0, 0.5)
    assert drv.instance.requests["a"].token_times == [0.5]  # applied at launch
    assert drv.land(flight, None) is flight.events


def test_a_restarting_sequence_waits_for_the_token_ids_still_in_flight() -> None:
    drv, _ = _running(overlap=True)
    plan = drv.decide(0.01)[0]
    assert plan is not None
    drv.launch(plan, 0.01, 0.02)  # provisionally a second token, its id not back
    drv.instance.preempt_all()  # both restart at context 0
    again = drv.decide(0.02)[0]
    assert again is not None and drv.lacks_tokens(again)
    for r in drv.instance.requests.values():
        r.output_token_ids = [1, 2]
    assert not drv.lacks_tokens(again)
