"""``sloserve bench``'s printed block (vllm bench serve's labels), result file and plots."""

from __future__ import annotations

import json
from pathlib import Path

from sloserve.request import Request, RequestStatus
from sloserve.services.bench_metrics import per_request, timing, vllm_metrics
from sloserve.services.bench_report import (
    PLOTS,
    RATE_PLOT,
    format_vllm,
    ours,
    plot,
    scalars,
    write_results,
)


def _result(rate: float, goodput: dict[str, float]) -> dict[str, object]:
    r = Request("a", arrival_time=0.0, prompt_len=10, output_len=3)
    r.token_times, r.status, r.finish_time = [0.1, 0.2, 0.4], RequestStatus.FINISHED, 0.4
    t = [timing(r)]
    return {"requests": 1, "completed": 1, "duration": 0.4, "goodput_share": 1.0,
            "request_rate": rate, "model": "m", "endpoint": "grpc",
            **vllm_metrics(t, 0.4, goodput), **per_request(t)}


def test_printed_block_uses_vllms_labels_and_goodput_only_when_asked() -> None:
    text = format_vllm(_result(2.0, {"ttft": 500}))
    for label in ("Successful requests:", "Request throughput (req/s):",
                  "Request goodput (req/s):", "Output token throughput (tok/s):",
                  "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):", "P99 E2EL (ms):"):
        assert label in text, label
    assert "Mean TTFT (ms):                          100.00" in text
    assert "Request goodput" not in format_vllm(_result(2.0, {}))


def test_json_and_table_split_the_keys() -> None:
    out = _result(2.0, {})
    assert "ttfts" in out and "ttfts" not in scalars(out)
    assert set(ours(out)) == {"requests", "completed", "duration", "goodput_share",
                              "request_rate", "model", "endpoint"}


def test_result_file_has_one_line_per_rate(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_results(str(path), [_result(1.0, {})])
    assert json.loads(path.read_text())["ttfts"] == [0.1]  # one rate: plain JSON
    write_results(str(path), [_result(1.0, {}), _result(2.0, {})])
    assert [json.loads(x)["request_rate"] for x in path.read_text().splitlines()] == [1.0, 2.0]


def test_one_rate_plots_the_cdfs_only(tmp_path: Path) -> None:
    written = plot(str(tmp_path / "p"), [_result(1.0, {})])
    assert [p.name for p in written] == list(PLOTS)
    assert not (tmp_path / "p" / RATE_PLOT).exists()
