"""A scheduler killed mid-run (SIGKILL) and restarted loses no accepted request:
it reloads them from Redis, the gateway reconnects and every stream completes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sloserve.client import Chunk, Client
from sloserve.services.stack import Stack


def test_sigkilled_scheduler_resumes_every_stream_without_loss_or_duplicates(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi")
    client = Client(stack.gateway)
    n, max_tokens = 12, 60
    results: dict[int, list[Chunk]] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(n + 1)

    def one(k: int) -> None:
        try:
            chunks: list[Chunk] = []
            for c in client.generate(prompt_token_ids=[65 + k] * (50 + 20 * k),
                                     max_tokens=max_tokens, ttft_slo=30.0, tbt_slo=30.0):
                if not chunks:
                    started.wait(timeout=30)
                chunks.append(c)
            results[k] = chunks
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=30)  # every request has streamed its first token
    time.sleep(0.2)
    stack.kill("scheduler-lp0")  # SIGKILL: no chance to flush anything
    stack.restart("scheduler-lp0")
    for t in threads:
        t.join(timeout=90)
    assert not errors, errors
    assert len(results) == n
    for k, chunks in results.items():
        assert [c.index for c in chunks] == list(range(max_tokens)), k  # complete, no duplicate
        assert chunks[-1].finish_reason == "length"
        # the same deterministic pseudo-tokens as an uninterrupted run would produce
        from sloserve.services.executor.backends import pseudo_token

        rid = chunks[0].request_id
        assert [c.token_id for c in chunks] == [pseudo_token(rid, i) for i in range(max_tokens)]
