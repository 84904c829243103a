"""End to end on vLLM: SDK -> gateway -> scheduler -> executor (`--backend vllm`, SmolLM2)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sloserve.client import Chunk, Client
from sloserve.policies.sarathi import SarathiConfig
from sloserve.services.stack import Stack


# eager: compiling the model (what `up` and stock vllm serve do) took 190 s of CI's 900 s on
# a fast 2-core host and over 300 s on a slow one; the compiled model's greedy tokens are
# pinned at the backend (tests/services/executor/test_vllm_backend.py), which is the same
# `VllmBackend` this executor runs
@pytest.mark.timeout(600)
def test_vllm_stack_streams_greedy_paris_next_to_a_chunked_request(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", backend="vllm", model="smollm2-135m", gpu="cpu",
                        policy_config=SarathiConfig(token_budget=16), enforce_eager=True)
    client = Client(stack.gateway)
    results: dict[str, list[Chunk]] = {}

    def one(rid: str, prompt: str, max_tokens: int) -> None:
        results[rid] = list(client.generate(prompt, max_tokens=max_tokens, request_id=rid,
                                            temperature=0, ttft_slo=600, tbt_slo=600))

    long_prompt = "Describe the water cycle in detail, step by step, for a class of children:"
    threads = [threading.Thread(target=one, args=("paris", "The capital of France is", 4)),
               threading.Thread(target=one, args=("long", long_prompt, 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    text = "".join(c.text for c in results["paris"])
    assert text.startswith(" Paris"), text
    assert [c.index for c in results["long"]] == list(range(6))  # chunked by the 16 budget
    assert results["long"][-1].finish_reason == "length"
