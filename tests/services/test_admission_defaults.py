"""Issue 35: the deployment's default SLOs never refuse a servable request, and a shed
answer says when to retry (HTTP ``Retry-After``, gRPC ``grpc-retry-pushback-ms``).

An idle live sim stack whose gateway default TTFT SLO (5 ms) is below what a 2,000-token
prompt takes alone (the roofline predicts ~0.1 s on the A100 profile): a request without
an SLO of its own is served, over gRPC and over HTTP; one that asks for the same 5 ms
itself is shed at the door, with the pushback. And ``finish_reason`` as vLLM gives it."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from sloserve.admission import RETRY_AFTER_S, SHED_PREFIX, Admission
from sloserve.client import Client, RequestDropped
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

DEFAULT_TTFT = 0.005  # s: the gateway's default, below any 2,000-token prefill
PROMPT = [65] * 2000


@pytest.fixture
def stack(start_stack: Callable[..., Stack]) -> Stack:
    # admission on (`up --admission`; off by default, as vLLM), so the first test shows
    # that even a shedding stack never sheds for a default SLO
    return start_stack(http_port=free_port(), ttft_slo=DEFAULT_TTFT, perf_model="roofline",
                       admission=Admission())


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


def test_a_stop_id_as_the_last_allowed_token_finishes_with_stop_as_vllm_says(
        stack: Stack) -> None:
    """vLLM's ``check_stop`` looks for EOS and stop ids before the length cap, so a stop
    token sampled as the last allowed one is ``stop``, not ``length`` (issue 35)."""
    from sloserve.services.executor.backends import pseudo_token

    rid = "finish-reason-probe"
    tokens = [pseudo_token(rid, k) for k in range(4)]  # the sim's output, as it will be
    last = tokens[3]
    stop = [last] if last not in tokens[:3] else []
    assert stop, "the probe's 4th token repeats an earlier one: pick another id"
    with Client(stack.gateway) as client:
        chunks = list(client.generate(prompt_token_ids=[65] * 8, max_tokens=4,
                                      request_id=rid, stop_token_ids=stop))
        assert [c.token_id for c in chunks] == tokens and chunks[-1].finish_reason == "stop"
        plain = list(client.generate(prompt_token_ids=[65] * 8, max_tokens=4,
                                     request_id=rid + "-2"))
        assert plain[-1].finish_reason == "length"


def test_eos_as_the_last_allowed_token_is_stop_unless_eos_is_ignored() -> None:
    from sloserve.services.gateway.server import _finish_reason
    from sloserve.services.proto import common_pb2, scheduler_pb2

    eos = frozenset({2})
    spec = common_pb2.RequestSpec(max_tokens=4)
    last = scheduler_pb2.TokenEvent(index=3, token_id=2, finished=True)
    assert _finish_reason(last, spec, eos) == "stop"
    assert _finish_reason(scheduler_pb2.TokenEvent(index=3, token_id=7), spec, eos) == "length"
    assert _finish_reason(scheduler_pb2.TokenEvent(index=1, token_id=2), spec, eos) == "stop"
    spec.sampling.ignore_eos = True
    assert _finish_reason(last, spec, eos) == "length"
