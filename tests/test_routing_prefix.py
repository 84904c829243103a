"""Prefix-aware routing sends a request where its prefix went, unless that is overloaded."""

from __future__ import annotations

import pytest

from sloserve.controller import Controller, Dispatch
from sloserve.request import Request
from sloserve.routing_prefix import PrefixRouter


def turn(rid: str, ids: tuple[int, ...] | None) -> Request:
    return Request(rid, 0.0, 512 * len(ids or (1,)), 4, hash_ids=ids)


def controller(load_bound: int = 4) -> Controller:
    ids = ["lp0", "lp1", "lp2", "lp3"]
    return Controller([(i, "lp") for i in ids],
                      prefix_router=PrefixRouter(ids, capacity_units=100, load_bound=load_bound))


def place(c: Controller, r: Request) -> str:
    action = c.admit(r, 0.0)
    assert isinstance(action, Dispatch)
    for i in c.waiting_prefills:  # every request got its first token: loads back to 0
        c.on_instance_state(i, 0, 0.0)
    return action.instance_id


def test_a_later_turn_follows_its_conversation() -> None:
    c = controller()
    homes = [place(c, turn(f"c{k}", (100 + k, 200 + k))) for k in range(4)]
    assert sorted(homes) == ["lp0", "lp1", "lp2", "lp3"]  # new conversations spread out
    for k in range(4):
        assert place(c, turn(f"c{k}-2", (100 + k, 200 + k, 300 + k))) == homes[k]


def test_load_bound_overrides_the_cached_prefix() -> None:
    c = controller(load_bound=2)
    home = place(c, turn("a", (1, 2)))
    c.on_instance_state(home, 3, 0.0)  # home is 3 prefills ahead of the idlest
    other = c.admit(turn("a2", (1, 2, 3)), 0.0).instance_id  # type: ignore[union-attr]
    assert other != home
    c.on_instance_state(home, 2, 0.0)  # within the bound again
    c.on_instance_state(other, 3, 0.0)  # (a2's instance, now the busy one)
    assert c.admit(turn("a3", (1, 2, 3, 4)), 0.0).instance_id == home  # type: ignore[union-attr]


def test_requests_without_identity_stay_round_robin() -> None:
    c = controller()
    assert [place(c, turn(f"r{k}", None)) for k in range(5)] == [
        "lp0", "lp1", "lp2", "lp3", "lp0"]


def test_the_remembered_prefixes_are_bounded() -> None:
    router = PrefixRouter(["a"], capacity_units=3)
    router.choose(turn("x", (1, 2, 3, 4, 5)), ["a"], {"a": 0})
    assert router.match("a", [hash((0, 1))]) == 0  # the oldest units were forgotten
    with pytest.raises(ValueError, match="capacity_units"):
        PrefixRouter(["a"], capacity_units=0)
