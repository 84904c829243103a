"""End to end with real compute: SDK -> gateway -> scheduler -> torch executor (tiny, CPU)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

import redis
from redis_source import redis_url

from sloserve.client import Chunk, Client
from sloserve.policies.sarathi import SarathiConfig
from sloserve.services.perfmodel import samples
from sloserve.services.stack import Stack

REDIS_URL = redis_url()  # the session's one Redis (tests/redis_source.py)

PROMPTS = {"a": 37, "b": 90}  # prompt lengths; longer than one 64-token chunk for "b"
MAX_TOKENS = {"a": 9, "b": 5}


def test_torch_stack_streams_tokens_and_publishes_every_executed_batch(
    start_stack: Callable[..., Stack],
) -> None:
    # no prefix caching: every prompt token is computed once, as the count below expects
    stack = start_stack(policy="sarathi", backend="torch", model="tiny", gpu="cpu",
                        prefix_caching=False,
                        num_blocks=256, policy_config=SarathiConfig(token_budget=64))
    client = Client(stack.gateway)
    results: dict[str, list[Chunk]] = {}

    def one(rid: str) -> None:
        ids = [(7 * k + len(rid)) % 256 for k in range(PROMPTS[rid])]
        results[rid] = list(client.generate(prompt_token_ids=ids, max_tokens=MAX_TOKENS[rid],
                                            request_id=rid, ttft_slo=5.0, tbt_slo=1.0))

    threads = [threading.Thread(target=one, args=(rid,)) for rid in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for rid, chunks in results.items():
        assert [c.index for c in chunks] == list(range(MAX_TOKENS[rid]))
        assert chunks[-1].finish_reason == "length"
        assert all(0 <= c.token_id < 512 for c in chunks)
    assert set(results) == set(PROMPTS)

    # every executed batch reaches the samples stream: the run samples carry each
    # prompt token once as a prefill chunk and every later token as a decode
    r = redis.Redis.from_url(REDIS_URL)
    want = (sum(PROMPTS.values()), sum(MAX_TOKENS.values()) - len(MAX_TOKENS))
    deadline = time.monotonic() + 5.0
    while True:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       r.xrange(f"{stack.prefix}:samples"))
        run = [samples.decode(f) for _, f in entries if f[b"src"] == b"run"]
        got = (sum(c for s in run for c, _ in s.shape.prefills),
               sum(len(s.shape.decodes) for s in run))
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert got == want
    assert all(s.duration > 0 for s in run)  # measured torch step times, not predictions
    assert any(f[b"src"] == b"sweep" for _, f in entries)  # the warm-up profiling sweep
