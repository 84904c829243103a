"""``slack`` on the live stack (sim backend): one burst of heterogeneous SLOs — decodes,
prompts whose TTFT SLO is near their prefill, prompts that never could make theirs — and
every stream ends with all its tokens, or a refusal that names the policy's rule."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sloserve.client import Chunk, Client, RequestDropped
from sloserve.services.stack import Stack

# (prompt tokens, max tokens, TTFT SLO, TBT SLO) per kind of request
KINDS = [
    (64, 32, 1.0, 0.2),  # decodes
    (1500, 4, 0.15, 0.2),  # tight: a TTFT SLO near the prompt's own prefill
    (3000, 4, 0.01, 0.2),  # never could: deferred to the background lane, served late
]


def test_slack_serves_a_heterogeneous_burst_end_to_end(start_stack: Callable[..., Stack]
                                                        ) -> None:
    # admission=None: the gateway's own shedding of late requests is off, so every request
    # reaches the policy and its triage
    stack = start_stack(policy="slack", instances=1, admission=None)
    client = Client(stack.gateway)
    assert client.info()["policies"] == ["slack"]

    def one(k: int) -> tuple[list[Chunk] | None, str]:
        prompt, out, ttft, tbt = KINDS[k % len(KINDS)]
        try:
            return list(client.generate(prompt_token_ids=[97 + k % 26] * prompt,
                                        max_tokens=out, ttft_slo=ttft, tbt_slo=tbt,
                                        ignore_eos=True)), ""
        except RequestDropped as exc:
            return None, exc.details

    with ThreadPoolExecutor(18) as pool:
        results = list(pool.map(one, range(18)))
    for k, (chunks, refused) in enumerate(results):
        if chunks is None:
            assert "slack" in refused
            continue
        assert [c.index for c in chunks] == list(range(KINDS[k % len(KINDS)][1]))
        assert chunks[-1].finish_reason == "length"
    # a request that never could make its TTFT is deferred, not refused (late="triage")
    assert all(results[k][0] is not None for k in range(2, 18, len(KINDS)))
    assert sum(chunks is not None for chunks, _ in results) >= 12
