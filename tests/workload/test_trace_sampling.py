"""Trace rows sampled in the trace's own order, sessions kept (issue 38, item 4)."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path

import pytest

from sloserve.request import Request
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate
from sloserve.workload.generate import default_sample, make_requests
from sloserve.workload.traces import TraceRequest, load_trace_file

# row k: prompt 100 + k, so a request's length names its row
PLAIN = [TraceRequest(100 + k, 10) for k in range(50)]
CHATS = [TraceRequest(100 + k, 10, hash_ids=(k // 5, 1000 + k)) for k in range(50)]


def rows_of(reqs: Sequence[Request]) -> list[int]:
    return [r.prompt_len - 100 for r in reqs]


def test_a_trace_with_prefix_or_session_identity_is_sampled_in_order_by_default() -> None:
    assert default_sample(PLAIN) == "random"
    assert default_sample(CHATS) == "ordered"
    assert default_sample([TraceRequest(5, 5, session="c1")]) == "ordered"
    w = make_requests(CHATS, num_requests=20, qps=2.0, seed=3)
    rows = rows_of(w.requests)
    start = rows[0]
    assert rows == list(range(start, start + 20))  # consecutive, in the trace's order
    assert w.info["sample"] == "ordered" and w.info["sample_offset"] == start
    assert [r.arrival_time for r in w.requests] == sorted(r.arrival_time for r in w.requests)
    # another seed, another window of the trace; a plain trace is still drawn at random
    assert rows_of(make_requests(CHATS, num_requests=20, qps=2.0, seed=4).requests) != rows
    plain = rows_of(make_requests(PLAIN, num_requests=20, qps=2.0, seed=3).requests)
    assert plain != sorted(plain)


def test_sample_is_an_option_either_way() -> None:
    rows = rows_of(make_requests(PLAIN, num_requests=10, qps=1.0, seed=1,
                                 sample="ordered").requests)
    assert rows == list(range(rows[0], rows[0] + 10))
    w = make_requests(CHATS, num_requests=10, qps=1.0, seed=1, sample="random")
    assert rows_of(w.requests) != sorted(rows_of(w.requests)) and w.info["sample"] == "random"


def test_bad_sample_requests_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"sample \(--sample\): must be one of"):
        make_requests(PLAIN, num_requests=5, qps=1.0, sample="shuffled")
    with pytest.raises(ValueError, match=r"--sample ordered takes consecutive rows.*only 50"):
        make_requests(CHATS, num_requests=51, qps=1.0)
    timed = [TraceRequest(10, 10, arrival=float(k)) for k in range(5)]
    with pytest.raises(ValueError, match=r"sample \(--sample\): 'random' cannot keep"):
        make_requests(timed, num_requests=5, qps=None, arrival="trace", sample="random")
    with pytest.raises(ValueError, match=r"sample \(--sample\)"):
        SimConfig(policy="sarathi", sample="shuffled").validate()


def test_a_session_column_keeps_each_conversations_turns_in_order(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    turns = [{"conversation_id": f"c{k % 3}", "input_len": 200 + 100 * (k // 3),
              "output_len": 20} for k in range(30)]  # c0, c1, c2 interleaved, growing prompts
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    trace = load_trace_file(path)
    assert [t.session for t in trace[:4]] == ["c0", "c1", "c2", "c0"]
    w = make_requests(trace, num_requests=24, qps=5.0, seed=2)
    offset = w.info["sample_offset"]
    assert w.info["sample"] == "ordered" and isinstance(offset, int)
    by_conv: dict[str, list[int]] = {}
    for r, t in zip(w.requests, trace[offset:offset + 24], strict=True):
        assert r.prompt_len == t.prompt_len  # the trace's rows, in its order
        by_conv.setdefault(str(t.session), []).append(r.prompt_len)
    # every conversation's turns arrive in their order (growing prompts), none left out
    assert sorted(by_conv) == ["c0", "c1", "c2"]
    assert all(v == sorted(v) and len(v) >= 7 for v in by_conv.values())


def test_a_missing_session_id_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("session_id,input_len,output_len\na,10,5\n,10,5\n")
    from sloserve.workload.traces import TraceError

    with pytest.raises(TraceError, match=r"s\.csv line 3: session_id is missing"):
        load_trace_file(path)


def test_simulate_reports_too_long_rows_and_rates_offered_and_served(tmp_path: Path) -> None:
    """Half of the rows are too long for the context: counted, and the offered rate is
    what the rest arrived at, not the nominal one (issue 38)."""
    path = tmp_path / "half_too_long.csv"
    path.write_text("input_len,output_len\n" + "100,10\n9000,10\n" * 50)
    out = simulate(SimConfig(policy="sarathi", trace=None, trace_file=str(path),
                             num_requests=200, qps=4.0))
    assert len(load_trace_file(path)) == 100
    assert out["too_long"] + out["requests"] == 200 and 70 <= out["too_long"] <= 130
    assert out["offered_rps"] < 0.75 * 4.0  # about half of the asked rate arrived
    assert out["served_rps"] is not None and out["completed"] == out["requests"]


def test_bench_workload_counts_rows_too_long_for_the_served_model(tmp_path: Path) -> None:
    from sloserve.services.bench_cmd import workload_rows

    f = tmp_path / "t.csv"
    f.write_text("input_len,output_len\n" + "100,20\n9000,50\n" * 10)
    args = Namespace(trace=None, trace_file=str(f), qps=2.0, num_requests=40, ttft_slo=None,
                     tbt_slo=None, slo_mix=None, jct_share=0.0, arrival="poisson", cv=1.0,
                     sample=None, seed=0, prompt_salt="")
    reqs, too_long = workload_rows(args, "llama-3-8b", "a100")
    assert too_long > 0 and len(reqs) + too_long == 40
    assert all(r.prompt_len == 100 for r in reqs)
