"""Orca baseline (AccelGen §3/§6.1): whole prefills beside decodes, batch 8, 8K reservation."""

from __future__ import annotations

import pytest

from sloserve.batch import BatchPlan
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.orca import OrcaConfig, OrcaPolicy
from sloserve.request import Request

PM = LinearPerfModel()


def make(num_blocks: int = 10_000, block_size: int = 16, **knobs: int) -> Instance:
    return Instance("i0", OrcaPolicy(OrcaConfig(**knobs)), BlockManager(num_blocks, block_size),
                    PM)


def step(inst: Instance, now: float) -> tuple[BatchPlan, float]:
    plan, _, _ = inst.schedule(now)
    end = now + PM.predict(plan.shape())
    inst.complete(plan, end)
    return plan, end


def tokens_of(plan: BatchPlan) -> dict[str, int]:
    return {i.request_id: i.num_tokens for i in plan.items}


def test_whole_prompt_joins_running_decodes_in_one_iteration() -> None:
    inst = make()
    inst.add_request(Request("d", 0.0, 100, 50), 0.0)
    _, now = step(inst, 0.0)
    inst.add_request(Request("long", now, 6000, 5), now)
    plan, _ = step(inst, now)
    assert tokens_of(plan) == {"d": 1, "long": 6000}  # no chunking, decode not stalled


def test_batch_holds_at_most_eight_sequences_by_default() -> None:
    inst = make()
    for i in range(10):
        inst.add_request(Request(f"r{i}", 0.0, 10, 100), 0.0)
    plan, now = step(inst, 0.0)
    assert sorted(tokens_of(plan)) == [f"r{i}" for i in range(8)]
    plan, _ = step(inst, now)
    assert len(plan.items) == 8 and set(tokens_of(plan).values()) == {1}  # r8, r9 wait


def test_max_seq_len_reservation_limits_admission_not_free_blocks() -> None:
    # 1100 blocks of 16 = 17,600 tokens: two 8K reservations fit, a third does not
    inst = make(num_blocks=1100)
    for i in range(3):
        inst.add_request(Request(f"r{i}", 0.0, 100, 100), 0.0)
    plan, _ = step(inst, 0.0)
    assert sorted(tokens_of(plan)) == ["r0", "r1"]
    assert inst.kv.num_free_blocks > 1000  # plenty of real KV left, yet r2 waits


def test_bad_knob_names_the_field() -> None:
    with pytest.raises(ValueError, match="^max_seq_len: "):
        OrcaConfig(max_seq_len=0)
