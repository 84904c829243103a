"""End to end: the vLLM policy ignores a prompt it can never batch, and the client is told why."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sloserve.client import Client, RequestDropped
from sloserve.policies.vllm import VllmConfig
from sloserve.services.stack import Stack


def test_prompt_over_max_num_batched_tokens_is_dropped_with_vllms_warning(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="vllm", policy_config=VllmConfig(max_num_batched_tokens=16))
    client = Client(stack.gateway)
    with pytest.raises(RequestDropped, match=r"Input prompt \(40 tokens\) is too long and "
                                             r"exceeds limit of 16"):
        list(client.generate(prompt_token_ids=list(range(1, 41)), max_tokens=2,
                             request_id="long", timeout=60))
    short = list(client.generate(prompt_token_ids=list(range(1, 9)), max_tokens=2,
                                 request_id="short", timeout=60))
    assert [c.index for c in short] == [0, 1]  # the queue is not blocked behind it
