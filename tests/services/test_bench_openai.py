"""``sloserve bench --endpoint openai``: SSE chunk accounting (pure) and the CLI flags.

The end-to-end run against stock ``vllm serve`` is ``test_bench_openai_vllm.py``.
"""

from __future__ import annotations

import argparse

import pytest

from sloserve.request import Request
from sloserve.services import bench_cmd
from sloserve.services.bench_openai import Stream, base_url, body, parse_chunk, token_times


def _chunk(ids: list[int] | None, text: str = "x", finish: str | None = None) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


def test_token_ids_count_tokens_and_coalesced_chunks_spread_back_to_the_previous_one() -> None:
    s = Stream()
    parse_chunk(_chunk([5]), 10.0, s)
    parse_chunk(_chunk([6]), 10.1, s)
    parse_chunk(_chunk([7, 8, 9, 10]), 10.5, s)  # the server coalesced four tokens
    parse_chunk(_chunk([11], finish="length"), 10.6, s)
    parse_chunk({"choices": [], "usage": {"completion_tokens": 7}}, 10.61, s)
    assert s.saw_token_ids and s.usage_tokens == 7 and s.finish_reason == "length"
    assert token_times(s, 9.0) == pytest.approx([10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6])


def test_several_tokens_in_the_first_chunk_all_arrive_with_it() -> None:
    s = Stream()
    parse_chunk(_chunk([1, 2]), 3.0, s)
    parse_chunk(_chunk([3]), 3.5, s)
    assert token_times(s, 1.0) == [3.0, 3.0, 3.5]


def test_without_token_ids_chunks_count_one_and_usage_respreads() -> None:
    s = Stream()
    for t in (1.0, 2.0, 3.0):
        parse_chunk(_chunk(None), t, s)
    parse_chunk(_chunk(None, text="", finish="length"), 3.0, s)  # empty final text: no token
    assert token_times(s, 0.0) == [1.0, 2.0, 3.0]
    s.usage_tokens = 5  # the server coalesced without telling which chunk
    assert token_times(s, 0.0) == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0])


def test_request_body_asks_for_exact_lengths_with_token_id_prompt() -> None:
    req = Request("r000003", prompt_len=12, output_len=7, arrival_time=0.0)
    b = body(req, "m", 0.0)
    assert b["prompt"] == bench_cmd.prompt_ids(req) and len(b["prompt"]) == 12
    assert (b["max_tokens"], b["ignore_eos"], b["stream"], b["temperature"]) == (7, True, True, 0.0)
    assert b["stream_options"] == {"include_usage": True}


def test_cli_dispatch_flags() -> None:
    ap = argparse.ArgumentParser()
    bench_cmd.add_parser(ap.add_subparsers())
    args = ap.parse_args(["bench", "--endpoint", "openai", "--target", "127.0.0.1:8000",
                          "--trace", "sharegpt", "--qps", "1", "--num-requests", "2"])
    assert (args.endpoint, args.model, args.temperature) == ("openai", None, 0.0)
    assert base_url(args.target) == "http://127.0.0.1:8000"
    assert ap.parse_args(["bench", "--trace", "sharegpt", "--qps", "1",
                          "--num-requests", "2"]).endpoint == "grpc"
