"""The controller (Ascendra §4, §6.1, generalised): routing, HP tickets, offloads, drops, loss."""

from __future__ import annotations

import pytest
from helpers import req

from sloserve.controller import (
    DROP_BY_POLICY,
    DROP_LEFT,
    DROP_NO_HP,
    Controller,
    Dispatch,
    Drop,
)
from sloserve.instance import TokenEvent

LP3 = [("lp0", "lp"), ("lp1", "lp"), ("lp2", "lp")]


def route(c: Controller, rid: str, now: float = 0.0) -> str:
    a = c.admit(req(rid, 10), now)
    assert isinstance(a, Dispatch)
    return a.instance_id


def first_token(rid: str) -> TokenEvent:
    return TokenEvent(rid, 0, 0.0, False)


def test_new_requests_go_round_robin_over_lp() -> None:
    c = Controller(LP3)
    assert [route(c, f"r{i}") for i in range(5)] == ["lp0", "lp1", "lp2", "lp0", "lp1"]


def test_a_ticket_routes_exactly_one_new_request_to_hp_at_a_time() -> None:
    c = Controller([("lp0", "lp"), ("lp1", "lp"), ("hp0", "hp")])
    assert c.admit(req("t1", 10), 0.0) == Dispatch("t1", "hp0", "ticket")  # idle HP: a ticket
    c.on_instance_state("hp0", 0, 0.1)  # even with its queue empty again...
    assert [route(c, f"r{i}", 0.1) for i in range(3)] == ["lp0", "lp1", "lp0"]
    c.on_tokens([first_token("r0")])  # ...only the ticketed request's first token frees it
    assert route(c, "r3", 0.1) == "lp1"
    c.on_tokens([first_token("t1")])
    assert route(c, "t2", 0.2) == "hp0"
    assert route(c, "r4", 0.2) == "lp0"


def test_no_ticket_while_the_hp_queue_is_not_empty() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")])
    c.on_instance_state("hp0", 2, 0.0)  # offloads waiting there
    assert route(c, "a") == "lp0"
    c.on_instance_state("hp0", 0, 0.5)
    assert route(c, "b", 0.5) == "hp0"


def test_no_ticket_while_the_hp_offers_none_for_lack_of_free_kv() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")])
    c.on_instance_state("hp0", 0, 0.0, offers_ticket=False)  # queue empty, KV spoken for
    assert route(c, "a") == "lp0"
    c.on_instance_state("hp0", 0, 0.5)
    assert route(c, "b", 0.5) == "hp0"


def test_without_ticket_entry_new_requests_never_go_to_hp() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")], ticket_entry=False)
    assert {route(c, f"r{i}") for i in range(4)} == {"lp0"}


def test_offloads_go_round_robin_over_hp_whatever_their_queues() -> None:
    """§4: round-robin within a pool, not least-loaded; a lost HP is skipped."""
    c = Controller([("lp0", "lp"), ("hp0", "hp"), ("hp1", "hp"), ("hp2", "hp")],
                   ticket_entry=False)
    c.on_instance_state("hp0", 5, 0.0)  # hp0 loaded, hp1/hp2 empty: still hp0's turn first
    got = []
    for i in range(4):
        (a,) = c.on_scheduled("lp0", [req(f"o{i}", 10)], [], 0.0)
        assert isinstance(a, Dispatch) and a.cause == "offload"
        got.append(a.instance_id)
    assert got == ["hp0", "hp1", "hp2", "hp0"]
    c.on_instance_lost("hp1", 0.1)
    got = [c.on_scheduled("lp0", [req(f"p{i}", 10)], [], 0.1)[0] for i in range(3)]
    assert [a.instance_id for a in got if isinstance(a, Dispatch)] == ["hp2", "hp0", "hp2"]


def test_an_offload_with_no_hp_is_a_drop_with_its_reason() -> None:
    c = Controller([("lp0", "lp"), ("lp1", "lp")])
    r = req("x7", 10)
    assert c.on_scheduled("lp0", [r], [], 0.0) == [Drop("x7", DROP_NO_HP)]
    assert r.num_offloads == 0


def test_a_policy_drop_ends_the_request_and_frees_its_ticket() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")])
    assert route(c, "t") == "hp0"
    c.on_instance_state("hp0", 0, 0.0)
    assert c.on_scheduled("hp0", [], [req("t", 10)], 0.1) == [Drop("t", DROP_BY_POLICY)]
    assert "t" not in c.location
    assert route(c, "u", 0.1) == "hp0"  # the ticket is free again


def test_cancel_and_finish_forget_the_request() -> None:
    c = Controller(LP3)
    route(c, "a")
    route(c, "b")
    c.on_cancel("a", 0.1)
    c.on_tokens([TokenEvent("b", 0, 0.1, True)])
    assert c.location == {}


def test_a_lost_instance_gets_no_new_work_and_its_requests_rerun_elsewhere() -> None:
    c = Controller(LP3)
    placed = {f"r{i}": route(c, f"r{i}") for i in range(3)}
    assert placed == {"r0": "lp0", "r1": "lp1", "r2": "lp2"}
    actions = c.on_instance_lost("lp1", 1.0)
    assert [(a.request_id, a.cause) for a in actions if isinstance(a, Dispatch)] == [
        ("r1", "rerun")]
    assert all(a.instance_id != "lp1" for a in actions if isinstance(a, Dispatch))
    assert "lp1" not in {route(c, f"n{i}", 1.1) for i in range(6)}
    c.on_instance_back("lp1", 2.0)
    assert "lp1" in {route(c, f"m{i}", 2.1) for i in range(3)}


def test_with_no_healthy_instance_left_requests_stay_and_new_ones_are_refused() -> None:
    c = Controller([("lp0", "lp")])
    route(c, "a")
    assert c.on_instance_lost("lp0", 1.0) == []  # nowhere to go: it waits, not dropped
    assert c.location == {"a": "lp0"}
    assert isinstance(c.admit(req("b", 10), 1.1), Drop)
    c.on_instance_back("lp0", 2.0)
    assert c.location == {"a": "lp0"} and route(c, "c", 2.1) == "lp0"


def test_without_lp_new_requests_go_round_robin_over_all_instances() -> None:
    c = Controller([("hp0", "hp"), ("hp1", "hp")])
    assert [route(c, f"r{i}") for i in range(3)] == ["hp0", "hp1", "hp0"]


def test_recording_keeps_every_decision_in_order() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")], record=True)
    route(c, "a")
    route(c, "b")
    c.on_scheduled("lp0", [req("b", 10)], [], 0.1)
    assert c.decisions == [Dispatch("a", "hp0", "ticket"), Dispatch("b", "lp0", "route"),
                           Dispatch("b", "hp0", "offload")]


def test_bad_configuration_and_reports_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Controller([])
    with pytest.raises(ValueError, match="unique.*'a'"):
        Controller([("a", "lp"), ("a", "hp")])
    with pytest.raises(ValueError, match="role"):
        Controller([("a", "xx")])
    c = Controller([("lp0", "lp"), ("hp0", "hp")])
    with pytest.raises(ValueError, match="instance_id.*'nope'"):
        c.on_instance_state("nope", 0, 0.0)
    with pytest.raises(ValueError, match="num_waiting_prefills"):
        c.on_instance_state("hp0", -1, 0.0)
    with pytest.raises(ValueError, match="instance_id.*'zz'"):
        c.on_instance_lost("zz", 0.0)


def test_a_joined_instance_takes_new_work_in_its_role_pool() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")])
    route(c, "t")  # the HP's ticket is taken
    c.on_instance_joined("lp1", "lp", 1.0)
    assert [route(c, f"r{i}", 1.0) for i in range(4)] == ["lp0", "lp1", "lp0", "lp1"]
    c.on_instance_joined("hp1", "hp", 1.0)
    assert route(c, "u", 1.1) == "hp1"  # a joined HP offers a ticket at once
    with pytest.raises(ValueError, match="instance_id.*'lp1'.*already"):
        c.on_instance_joined("lp1", "lp", 1.2)
    with pytest.raises(ValueError, match="role"):
        c.on_instance_joined("x", "mid", 1.2)


def test_a_left_instance_reruns_its_requests_elsewhere_and_is_forgotten() -> None:
    c = Controller(LP3, record=True)
    placed = {f"r{i}": route(c, f"r{i}") for i in range(6)}
    actions = c.on_instance_left("lp1", 1.0)
    moved = {a.request_id: a.instance_id for a in actions if isinstance(a, Dispatch)}
    assert set(moved) == {r for r, i in placed.items() if i == "lp1"}
    assert all(a.cause == "rerun" for a in actions if isinstance(a, Dispatch))
    assert "lp1" not in moved.values() and "lp1" not in c.waiting_prefills
    assert "lp1" not in {route(c, f"n{i}", 1.1) for i in range(6)}
    with pytest.raises(ValueError, match="instance_id.*'lp1'"):
        c.on_instance_state("lp1", 0, 1.2)
    c.on_instance_joined("lp1", "lp", 2.0)  # the same id may join again
    assert "lp1" in {route(c, f"m{i}", 2.1) for i in range(3)}


def test_the_last_instance_leaving_drops_its_requests_with_the_reason() -> None:
    c = Controller([("lp0", "lp"), ("hp0", "hp")])
    route(c, "a")  # ticket: hp0
    route(c, "b")  # lp0
    c.on_instance_left("lp0", 1.0)  # b re-runs on hp0
    assert c.location == {"a": "hp0", "b": "hp0"}
    actions = c.on_instance_left("hp0", 1.1)
    assert sorted(actions, key=lambda a: a.request_id) == [Drop("a", DROP_LEFT),
                                                           Drop("b", DROP_LEFT)]
    assert c.location == {} and isinstance(c.admit(req("c", 10), 1.2), Drop)
    c.on_instance_joined("hp1", "hp", 2.0)
    assert route(c, "d", 2.0) == "hp1"


def test_a_restored_request_stays_where_it_was_and_reruns_if_its_instance_is_lost() -> None:
    """Issue 34, item 6: a request an instance restored after a restart is placed there
    (no routing); it moves only as any other would, when that instance is lost."""
    c = Controller(LP3)
    c.on_restored("r", "lp1", 0.0)
    assert c.location == {"r": "lp1"} and route(c, "new") == "lp0"  # round-robin untouched
    moved = c.on_instance_lost("lp1", 0.1)
    assert [(a.request_id, a.cause) for a in moved if isinstance(a, Dispatch)] == [
        ("r", "rerun")]
    with pytest.raises(ValueError, match=r"^instance_id: unknown instance 'lp9'"):
        c.on_restored("s", "lp9", 0.2)
