"""The synthetic multi-turn workload: turns extend their conversation, system prompts shared."""

from __future__ import annotations

import pytest

from sloserve.kv_prefix import PREFIX_UNIT
from sloserve.workload.multiturn import MultiTurnSpec, multiturn_requests


def test_turns_extend_the_previous_context_and_arrive_in_order() -> None:
    reqs = multiturn_requests(num_requests=400, qps=4.0, seed=1).requests
    assert len(reqs) == 400
    assert [r.arrival_time for r in reqs] == sorted(r.arrival_time for r in reqs)
    ids = [r.hash_ids or () for r in reqs]
    for r, h in zip(reqs, ids):  # the ids cover the stream: prompt, then answer
        assert len(h) == -(-(r.prompt_len + r.output_len) // PREFIX_UNIT)
    extended = 0
    for j, b in enumerate(reqs):
        # an earlier turn of the same conversation: its ids are a prefix of b's
        earlier = [a for a, h in zip(reqs[:j], ids[:j]) if ids[j][:len(h)] == h]
        if earlier:
            extended += 1
            a = earlier[-1]
            assert b.prompt_len > a.prompt_len + a.output_len  # context + answer + new message
    assert extended > 100, "later turns resend earlier turns' context"


def test_system_prompts_are_shared_across_conversations() -> None:
    reqs = multiturn_requests(num_requests=300, qps=4.0, seed=2,
                              spec=MultiTurnSpec(num_system_prompts=2,
                                                 system_prompt_units=(2,))).requests
    heads = {r.hash_ids[:2] for r in reqs if r.hash_ids is not None}
    assert len(heads) == 2


def test_same_seed_same_workload_and_rate_is_kept() -> None:
    a = multiturn_requests(num_requests=500, qps=5.0, seed=3)
    b = multiturn_requests(num_requests=500, qps=5.0, seed=3)
    assert [(r.arrival_time, r.prompt_len, r.hash_ids) for r in a.requests] == [
        (r.arrival_time, r.prompt_len, r.hash_ids) for r in b.requests]
    rate = (len(a.requests) - 1) / a.requests[-1].arrival_time
    assert 3.5 < rate < 6.5


def test_max_context_ends_a_conversation() -> None:
    reqs = multiturn_requests(num_requests=300, qps=4.0, seed=4, max_context=2048).requests
    assert all(r.prompt_len + r.output_len <= 2048 for r in reqs)


def test_bad_spec_names_the_field() -> None:
    with pytest.raises(ValueError, match="mean_turns"):
        multiturn_requests(num_requests=10, qps=1.0, spec=MultiTurnSpec(mean_turns=0.5))
    with pytest.raises(ValueError, match="qps"):
        multiturn_requests(num_requests=10, qps=0.0)
