"""With overlap and a batch in flight, a scheduler sends each iteration's tokens to the
gateway at once: no ``HOLD_S`` wait after the next plan leaves (the executor already has
work), so a token's delivery lag (gateway emit - iteration end) stays under the hold that
used to add 3 ms to every token, the first included (TTFT; docs/serve.md, "Prefix
caching and prefix-aware routing")."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from sloserve.client import Client
from sloserve.services.scheduler.server import HOLD_S
from sloserve.services.stack import Stack


def test_tokens_leave_without_the_hold_while_a_batch_is_in_flight(
        start_stack: Callable[..., Stack]) -> None:
    stack = start_stack(policy="sarathi", overlap=True)
    lags = [c.time - c.produced_time
            for c in Client(stack.gateway).generate(
                prompt_token_ids=list(range(40, 140)), max_tokens=120, ttft_slo=60.0,
                tbt_slo=30.0, ignore_eos=True)
            if c.index >= 2]  # decode steps: a batch is always in flight behind this one
    assert len(lags) == 118
    # with the hold every lag is >= HOLD_S (the timer), so the median is too
    assert statistics.median(lags) < HOLD_S, statistics.median(lags)
