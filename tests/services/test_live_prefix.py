"""Live prefix caching: SDK -> gateway -> scheduler (prefix-caching KV) -> torch executor."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import redis
from redis_source import redis_url

from sloserve.client import Client
from sloserve.policies.sarathi import SarathiConfig
from sloserve.services.perfmodel import samples
from sloserve.services.stack import Stack

REDIS_URL = redis_url()  # the session's one Redis (tests/redis_source.py)
PROMPT = [(11 * k + 5) % 256 for k in range(70)]  # 4 full blocks of 16, then 6 tokens


def test_a_repeated_prompt_starts_over_the_cached_blocks_and_generates_the_same(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", backend="torch", model="tiny", gpu="cpu",
                        num_blocks=256, policy_config=SarathiConfig(token_budget=128),
                        prefix_caching=True)
    client = Client(stack.gateway)

    def run(rid: str) -> list[int]:
        chunks = list(client.generate(prompt_token_ids=PROMPT, max_tokens=6, request_id=rid,
                                      temperature=0.0, ttft_slo=5.0, tbt_slo=1.0, timeout=60))
        return [c.token_id for c in chunks]

    first = run("first")
    second = run("second")  # after the first finished: its prompt blocks are cached
    assert second == first  # the reused KV is the KV a full prefill computes

    # the executed batches: the first prefill computed all 70 prompt tokens, the second
    # only the 6 past the 4 cached blocks, over a context of 64
    r = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + 5.0
    while True:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       r.xrange(f"{stack.prefix}:samples"))
        prefills = [p for _, f in entries if f[b"src"] == b"run"
                    for p in samples.decode(f).shape.prefills]
        if len(prefills) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert prefills == [(70, 0), (70 - 64, 64)]
