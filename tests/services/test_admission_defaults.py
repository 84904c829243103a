"""Issue 35: the deployment's default SLOs never refuse a servable request, and a shed
answer says when to retry (HTTP ``Retry-After``, gRPC ``grpc-retry-pushback-ms``).

An idle live sim stack whose gateway default TTFT SLO (5 ms) is below what a 2,000-token
prompt takes alone (the roofline predicts ~0.1 s on the A100 profile): a request without
an SLO of its own is served, over gRPC and over HTTP; one that asks for the same 5 ms
itself is shed at the door, with the pushback."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from sloserve.admission import RETRY_AFTER_S, SHED_PREFIX
from sloserve.client import Client, RequestDropped
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

DEFAULT_TTFT = 0.005  # s: the gateway's default, below any 2,000-token prefill
PROMPT = [65] * 2000


@pytest.fixture
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(http_port=free_port(), ttft_slo=DEFAULT_TTFT, perf_model="roofline")


def test_an_idle_stack_serves_a_request_without_an_slo_its_default_ttft_cannot_meet(
        stack: Stack) -> None:
    with Client(stack.gateway) as client:
        chunks = list(client.generate(prompt_token_ids=PROMPT, max_tokens=4, ignore_eos=True))
    assert len(chunks) == 4 and chunks[-1].finish_reason == "length"
    oai = openai.OpenAI(base_url=stack.http + "/v1", api_key="unused", max_retries=0)
    out = oai.completions.create(model="llama-3-8b", prompt=PROMPT, max_tokens=4,
                                 extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == 4


def test_a_request_with_its_own_ttft_is_shed_with_retry_pushback_over_grpc_and_http(
        stack: Stack) -> None:
    with Client(stack.gateway) as client, pytest.raises(RequestDropped) as exc:
        list(client.generate(prompt_token_ids=PROMPT, max_tokens=4, ttft_slo=DEFAULT_TTFT))
    assert SHED_PREFIX in exc.value.details and exc.value.retry_after == RETRY_AFTER_S
    r = httpx.post(stack.http + "/v1/completions", timeout=60,
                   json={"prompt": PROMPT, "max_tokens": 4, "ttft_slo_ms": DEFAULT_TTFT * 1e3})
    assert r.status_code == 429 and SHED_PREFIX in r.json()["error"]["message"]
    assert r.headers["retry-after"] == str(RETRY_AFTER_S)
