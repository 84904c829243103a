"""Trace loading: vendored traces, every accepted format, arrival units, bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sloserve.workload.traces import (
    TraceError,
    TraceRequest,
    load_trace,
    load_trace_file,
    trace_names,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- vendored traces -------------------------------------------------------


def test_vendored_traces_are_the_five_workloads() -> None:
    assert trace_names() == ["sharegpt", "arxiv", "bwb", "azure-conv", "azure-code"]


@pytest.mark.parametrize(
    ("name", "rows", "first"),
    [
        ("sharegpt", 30731, TraceRequest(74, 918)),
        ("arxiv", 28257, TraceRequest(3772, 54)),
        ("bwb", 33768, TraceRequest(1047, 1368)),
    ],
)
def test_vendored_length_traces_load_complete(name: str, rows: int, first: TraceRequest) -> None:
    trace = load_trace(name)
    assert len(trace) == rows
    assert trace[0] == first
    assert all(r.arrival is None for r in trace)


def test_azure_conv_arrivals_are_rebased_sorted_seconds() -> None:
    trace = load_trace("azure-conv")
    assert len(trace) == 19366
    assert trace[0] == TraceRequest(374, 44, 0.0)
    arrivals = [r.arrival for r in trace]
    assert all(a is not None for a in arrivals)
    assert arrivals == sorted(arrivals)
    # 18:15:46.6805900 -> 19:14:08.4025270 (README: span 3501.7 s)
    assert trace[-1].arrival == pytest.approx(3501.721937, abs=1e-6)


def test_load_trace_returns_a_fresh_list_each_time() -> None:
    a = load_trace("azure-code")
    a.clear()
    assert len(load_trace("azure-code")) == 8819


def test_unknown_trace_name_lists_known_names() -> None:
    with pytest.raises(TraceError, match="unknown trace 'nope'.*sharegpt"):
        load_trace("nope")


def test_load_trace_accepts_a_path(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "input_len,output_len\n5,6\n")
    assert load_trace(str(path)) == [TraceRequest(5, 6)]


# --- formats ---------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "num_prefill_tokens,num_decode_tokens",
        "ContextTokens,GeneratedTokens",
        "input_len,output_len",
        "prompt_len,output_len",
        "prompt_tokens,completion_tokens",
        "input_length,output_length",
        "Prompt Tokens,Completion-Tokens",
    ],
)
def test_csv_length_columns_recognised(tmp_path: Path, header: str) -> None:
    path = write(tmp_path, "t.csv", f"{header},extra\n10,20,x\n30,40,y\n")
    assert load_trace_file(path) == [TraceRequest(10, 20), TraceRequest(30, 40)]


@pytest.mark.parametrize(
    ("prompt", "output"),
    [
        ("input_length", "output_length"),
        ("prompt_tokens", "completion_tokens"),
        ("input_len", "output_len"),
    ],
)
def test_jsonl_length_fields_recognised(tmp_path: Path, prompt: str, output: str) -> None:
    lines = [
        json.dumps({prompt: 7, output: 8, "text": "hi"}),
        "",
        json.dumps({prompt: "9", output: 1}),
    ]
    path = write(tmp_path, "t.jsonl", "\n".join(lines) + "\n")
    assert load_trace_file(path) == [TraceRequest(7, 8), TraceRequest(9, 1)]


def test_gzip_csv_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("input_len,output_len\n3,4\n")
    assert load_trace_file(path) == [TraceRequest(3, 4)]


def test_integral_floats_accepted_and_zero_output_clamped_to_one(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "input_len,output_len\n415.0,0\n")
    assert load_trace_file(path) == [TraceRequest(415, 1)]


# --- arrivals --------------------------------------------------------------


def test_seconds_arrivals_rebased_to_zero(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrived_at,input_len,output_len\n5.0,1,2\n5.5,3,4\n")
    assert [r.arrival for r in load_trace_file(path)] == [0.0, 0.5]


def test_millisecond_column_converted_to_seconds(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_time_ms,input_len,output_len\n1000,1,2\n1250,3,4\n")
    assert [r.arrival for r in load_trace_file(path)] == [0.0, 0.25]


def test_epoch_milliseconds_detected_by_magnitude(tmp_path: Path) -> None:
    path = write(
        tmp_path, "t.csv", "timestamp,input_len,output_len\n1700000000000,1,2\n1700000001500,3,4\n"
    )
    assert [r.arrival for r in load_trace_file(path)] == [0.0, 1.5]


def test_wall_clock_timestamps_with_seven_fraction_digits(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:46.6806000,10,11\n"
        "2023-11-16 18:16:00.1,12,13\n"
    )
    arrivals = [r.arrival for r in load_trace_file(write(tmp_path, "t.csv", text))]
    assert arrivals == pytest.approx([0.0, 1e-5, 13.41941], abs=1e-9)


def test_iso8601_with_timezones(tmp_path: Path) -> None:
    lines = [
        {"timestamp": "2024-01-01T00:00:00Z", "input_length": 1, "output_length": 2},
        {"timestamp": "2024-01-01T01:00:01.5+01:00", "input_length": 3, "output_length": 4},
    ]
    path = write(tmp_path, "t.jsonl", "\n".join(json.dumps(x) for x in lines))
    assert [r.arrival for r in load_trace_file(path)] == [0.0, 1.5]


def test_unsorted_arrivals_sorted_with_lengths_attached(tmp_path: Path) -> None:
    path = write(
        tmp_path, "t.csv", "arrival_time,input_len,output_len\n3,30,31\n1,10,11\n2,20,21\n"
    )
    assert load_trace_file(path) == [
        TraceRequest(10, 11, 0.0),
        TraceRequest(20, 21, 1.0),
        TraceRequest(30, 31, 2.0),
    ]


# --- bad files: one line naming the file and the problem ---------------------


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("empty.csv", "", "file is empty"),
        ("header.csv", "input_len,output_len\n", "no requests"),
        (
            "cols.csv",
            "a,b\n1,2\n",
            "no prompt-length column (looked for num_prefill_tokens, ContextTokens",
        ),
        ("out.csv", "input_len,foo\n1,2\n", "no output-length column"),
        (
            "abc.csv",
            "input_len,output_len\n1,2\n3,abc\n",
            "line 3: output length 'abc' is not an integer",
        ),
        (
            "frac.csv",
            "input_len,output_len\n1.5,2\n",
            "line 2: prompt length '1.5' is not an integer",
        ),
        ("zero.csv", "input_len,output_len\n0,2\n", "line 2: prompt length 0 is not positive"),
        ("neg.csv", "input_len,output_len\n4,-2\n", "line 2: output length -2 is not positive"),
        ("miss.csv", "input_len,output_len\n4,\n", "line 2: output length is missing"),
        ("bad.jsonl", '{"input_len": 1, "output_len": 2}\n{oops\n', "line 2: not valid JSON"),
        ("list.jsonl", "[1, 2]\n", "line 1: expected a JSON object"),
        (
            "ts.csv",
            "timestamp,input_len,output_len\n2024-01-01 00:00:00,1,2\nyesterday,1,2\n",
            "line 3: arrival time 'yesterday' is not a timestamp",
        ),
        (
            "num.csv",
            "arrived_at,input_len,output_len\n1,1,2\nsoon,1,2\n",
            "line 3: arrival time 'soon' is not a number",
        ),
        (
            "noarr.csv",
            "arrived_at,input_len,output_len\n1,1,2\n,1,2\n",
            "line 3: arrival time is missing",
        ),
    ],
)
def test_bad_file_gives_one_line_naming_file_and_problem(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as err:
        load_trace_file(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert problem in message


def test_missing_file_named_in_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.csv"
    with pytest.raises(TraceError, match=r"absent\.csv: cannot read") as err:
        load_trace_file(path)
    assert isinstance(err.value, ValueError)


def test_undecodable_file_named_in_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.csv"
    path.write_bytes(b"input_len,output_len\n\xff\xfe\x00,1\n")
    with pytest.raises(TraceError, match=r"bin\.csv: cannot read"):
        load_trace_file(path)
