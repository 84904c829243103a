"""AccelGen §3's mixed-prompt dataset: named traces in given shares, drawn with replacement."""

from __future__ import annotations

from pathlib import Path

import pytest

from sloserve.workload.mix import mix_traces, write_trace_csv
from sloserve.workload.traces import load_trace, load_trace_file


def test_mix_has_each_trace_in_its_share_and_round_trips_as_a_file(tmp_path: Path) -> None:
    rows = mix_traces({"sharegpt": 0.65, "arxiv": 0.35}, size=2000, seed=1)
    arxiv = {(r.prompt_len, r.output_len) for r in load_trace("arxiv")}
    share = sum((r.prompt_len, r.output_len) in arxiv for r in rows) / len(rows)
    assert len(rows) == 2000 and 0.34 <= share <= 0.37  # a few ShareGPT rows may coincide
    assert load_trace_file(write_trace_csv(rows, tmp_path / "mix.csv")) == rows
    assert mix_traces({"sharegpt": 0.65, "arxiv": 0.35}, size=2000, seed=1) == rows


@pytest.mark.parametrize("shares", [{}, {"sharegpt": 0.5}, {"sharegpt": 1.5, "arxiv": -0.5}])
def test_bad_shares_are_rejected_naming_the_field(shares: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="^shares: "):
        mix_traces(shares)
