"""``bench --prompt-salt``: the same workload (lengths, arrivals) with other prompt token ids,
so runs against one server with a prefix cache do not find each other's prompts."""

from __future__ import annotations

import argparse
from pathlib import Path

from sloserve.request import Request
from sloserve.services import bench_cmd

TRACE = Path(__file__).resolve().parents[2] / "infra/experiments/data/sharegpt_cpu.csv"


def _workload(*extra: str) -> list[Request]:
    ap = argparse.ArgumentParser()
    bench_cmd.add_parser(ap.add_subparsers())
    args = ap.parse_args(["bench", "--trace-file", str(TRACE), "--qps", "2",
                          "--num-requests", "6", *extra])
    args.qps = args.qps[0] if isinstance(args.qps, list) else args.qps
    return bench_cmd.workload(args, "smollm2-135m", "cpu")


def test_a_salt_keeps_lengths_and_arrivals_and_changes_every_prompt() -> None:
    plain, salted, other = _workload(), _workload("--prompt-salt", "rate1"), _workload(
        "--prompt-salt", "rate2")
    shape = [[(r.prompt_len, r.output_len, r.arrival_time) for r in w]
             for w in (plain, salted, other)]
    assert shape[0] == shape[1] == shape[2]
    for a, b, c in zip(plain, salted, other):
        pa, pb, pc = (bench_cmd.prompt_ids(r) for r in (a, b, c))
        assert len(pa) == len(pb) == a.prompt_len
        assert pa[:8] != pb[:8] and pb[:8] != pc[:8]  # no shared prefix block
    assert [bench_cmd.prompt_ids(r) for r in salted] == [
        bench_cmd.prompt_ids(r) for r in _workload("--prompt-salt", "rate1")]  # deterministic
