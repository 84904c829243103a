"""Ascendra's controller (§4, §6.1): round-robin to LP, HP tickets, offloads to HP."""

from __future__ import annotations

import pytest
from helpers import req

from sloserve.router import Router


def test_new_requests_go_round_robin_over_lp() -> None:
    r = Router(["lp0", "lp1", "lp2"])
    assert [r.route(req(f"r{i}", 10), 0.0) for i in range(5)] == [
        "lp0", "lp1", "lp2", "lp0", "lp1"
    ]


def test_a_ticket_routes_exactly_one_new_request_to_hp_at_a_time() -> None:
    r = Router(["lp0", "lp1"], ["hp0"])
    assert r.route(req("t1", 10), 0.0) == "hp0"  # an idle HP holds a ticket from the start
    r.on_instance_state("hp0", 0, 0.1)  # even with its queue empty again...
    assert [r.route(req(f"r{i}", 10), 0.1) for i in range(3)] == ["lp0", "lp1", "lp0"]
    r.on_prefill_done("r0")  # ...only the ticketed request's first token frees the ticket
    assert r.route(req("r3", 10), 0.1) == "lp1"
    r.on_prefill_done("t1")
    assert r.route(req("t2", 10), 0.2) == "hp0"
    assert r.route(req("r4", 10), 0.2) == "lp0"


def test_no_ticket_while_the_hp_queue_is_not_empty() -> None:
    r = Router(["lp0"], ["hp0"])
    r.on_instance_state("hp0", 2, 0.0)  # offloads waiting there
    assert r.route(req("a", 10), 0.0) == "lp0"
    r.on_instance_state("hp0", 0, 0.5)
    assert r.route(req("b", 10), 0.5) == "hp0"


def test_without_ticket_entry_new_requests_never_go_to_hp() -> None:
    r = Router(["lp0"], ["hp0"], ticket_entry=False)
    assert {r.route(req(f"r{i}", 10), 0.0) for i in range(4)} == {"lp0"}


def test_offloads_go_to_the_hp_with_fewest_waiting_prefills_ties_round_robin() -> None:
    r = Router(["lp0"], ["hp0", "hp1"], ticket_entry=False)
    got = []
    for i in range(4):
        got.append(r.route_offload(req(f"o{i}", 10), 0.0))
        r.on_instance_state("hp0", 0, 0.0)  # both drained again: a tie every time
        r.on_instance_state("hp1", 0, 0.0)
    assert got == ["hp0", "hp1", "hp0", "hp1"]
    r.on_instance_state("hp0", 5, 0.1)
    r.on_instance_state("hp1", 1, 0.1)
    assert r.route_offload(req("o4", 10), 0.1) == "hp1"


def test_offload_without_hp_raises_naming_the_request() -> None:
    r = Router(["lp0", "lp1"])
    with pytest.raises(ValueError, match="route_offload: no HP instance.*'x7'"):
        r.route_offload(req("x7", 10), 0.0)


def test_without_lp_new_requests_go_round_robin_over_all_instances() -> None:
    r = Router([], ["hp0", "hp1"])
    assert [r.route(req(f"r{i}", 10), 0.0) for i in range(3)] == ["hp0", "hp1", "hp0"]


def test_bad_configuration_and_reports_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Router([])
    with pytest.raises(ValueError, match="unique.*'a'"):
        Router(["a"], ["a"])
    r = Router(["lp0"], ["hp0"])
    with pytest.raises(ValueError, match="instance_id.*'nope'"):
        r.on_instance_state("nope", 0, 0.0)
    with pytest.raises(ValueError, match="num_waiting_prefills"):
        r.on_instance_state("hp0", -1, 0.0)
