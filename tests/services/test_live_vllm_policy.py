"""End to end: the vLLM policy ignores a prompt it can never batch, and the client is told why."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sloserve.client import Client, RequestDropped
from sloserve.policies.vllm import VllmConfig
from sloserve.services import cli
from sloserve.services.stack import Stack


def test_prompt_over_max_num_batched_tokens_is_dropped_with_vllms_warning(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="vllm", policy_config=VllmConfig(max_num_batched_tokens=16))
    client = Client(stack.gateway)
    with pytest.raises(RequestDropped, match=r"Input prompt \(40 tokens\) is too long and "
                                             r"exceeds limit of 16"):
        list(client.generate(prompt_token_ids=list(range(1, 41)), max_tokens=2,
                             request_id="long", timeout=60))
    short = list(client.generate(prompt_token_ids=list(range(1, 9)), max_tokens=2,
                                 request_id="short", timeout=60))
    assert [c.index for c in short] == [0, 1]  # the queue is not blocked behind it


def test_bench_with_dropped_requests_measures_the_run_from_their_send_time(
    start_stack: Callable[..., Stack], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A request dropped before its first token has no gateway arrival time; the run's
    duration (and so throughput and goodput per second) must still span wall-clock
    seconds, not reach back to its trace offset (it once read ~1.8e9 s)."""
    stack = start_stack(policy="vllm", policy_config=VllmConfig(max_num_batched_tokens=16))
    trace = tmp_path / "mixed.csv"  # every other prompt exceeds the 16-token batch limit
    trace.write_text("prompt_len,output_len\n" + "".join(f"{8 if k % 2 else 40},2\n"
                                                         for k in range(6)))
    code = cli.main(["bench", "--target", stack.gateway, "--trace-file", str(trace),
                     "--qps", "8", "--num-requests", "6", "--ttft-slo", "30", "--tbt-slo", "30",
                     "--seed", "0", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert out["dropped"] >= 1 and out["completed"] >= 1
    assert 0 < out["duration"] < 120
    assert out["throughput_tok_s"] > 0.01
