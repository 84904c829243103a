"""Mooncake-style JSONL traces carry prefix identity (``hash_ids``) into requests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from sloserve.workload.generate import make_requests
from sloserve.workload.traces import TraceError, load_trace_file

ROWS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 20, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1600, "output_length": 30, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 500, "input_length": 300, "output_length": 10, "hash_ids": [4]},
]


def write(tmp_path: Path, rows: Sequence[object], name: str = "mooncake.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_rows_keep_hash_ids_and_ms_timestamps(tmp_path: Path) -> None:
    trace = load_trace_file(write(tmp_path, ROWS))
    assert [t.hash_ids for t in trace] == [(0, 1), (4,), (0, 1, 2, 3)]  # sorted by arrival
    assert [t.arrival for t in trace] == [0.0, 0.5, 1.5]  # Mooncake timestamps are in ms
    reqs = make_requests(trace, num_requests=3, qps=None, arrival="trace").requests
    assert [r.hash_ids for r in reqs] == [(0, 1), (4,), (0, 1, 2, 3)]


def test_a_trace_without_hash_ids_gives_requests_without_identity(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "hash_ids"} for r in ROWS]
    trace = load_trace_file(write(tmp_path, rows))
    assert all(t.hash_ids is None for t in trace)
    assert trace[1].arrival == 500.0  # plain "timestamp" stays seconds


@pytest.mark.parametrize("bad", [[], "x", [1, -2], [1.5], [True], None])
def test_bad_hash_ids_name_the_file_and_line(tmp_path: Path, bad: object) -> None:
    rows: list[object] = [dict(ROWS[0]), {**ROWS[1], "hash_ids": bad}]
    path = write(tmp_path, rows)
    with pytest.raises(TraceError, match=r"mooncake\.jsonl line 2: hash_ids"):
        load_trace_file(path)


def test_csv_hash_ids_are_json_lists(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('input_length,output_length,hash_ids\n600,5,"[3, 4]"\n')
    assert load_trace_file(path)[0].hash_ids == (3, 4)
