"""Ascendra on 2 LP + 1 HP: the gateway's core Router places requests and re-routes
the offloads the LP policy hands back."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sloserve.client import Chunk, Client
from sloserve.services.stack import Stack


def test_ascendra_streams_end_to_end_and_offloads_to_hp(start_stack: Callable[..., Stack]) -> None:
    stack = start_stack(policy="ascendra", instances=3, hp_instances=1)
    client = Client(stack.gateway)
    info = client.info()
    assert sorted(i["role"] for i in info["instances"]) == ["hp", "lp", "lp"]
    assert info["policies"] == ["ascendra"]  # one policy, two roles

    def one(k: int) -> list[Chunk]:
        # a burst of long prompts with a tight TTFT SLO: the LP queues cannot meet it
        return list(client.generate(prompt_token_ids=[97 + k % 26] * 3000, max_tokens=4,
                                    ttft_slo=0.6, tbt_slo=1.0))

    with ThreadPoolExecutor(24) as pool:
        streams = list(pool.map(one, range(24)))
    for chunks in streams:
        assert [c.index for c in chunks] == [0, 1, 2, 3]
        assert chunks[-1].finish_reason == "length"
    offloaded = [s[-1] for s in streams if s[-1].num_offloads]
    assert offloaded, "no request was offloaded"
    assert all(c.instance_id == "hp2" for c in offloaded)
    assert {s[-1].instance_id for s in streams} >= {"lp0", "lp1"}
