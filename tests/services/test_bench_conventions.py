"""``sloserve bench`` with vllm bench serve's conventions against a real ``sloserve up``-style
stack (sim backend): several rates, ``--goodput``, ``--json``, ``--result-file``, ``--plot``.

The same key set from ``--endpoint openai`` against stock ``vllm serve`` is pinned in
``test_bench_openai_vllm.py`` (both against ``bench_keys``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from bench_keys import RESULT_KEYS, SCALAR_KEYS

from sloserve.services import cli
from sloserve.services.bench_report import PLOTS, RATE_PLOT
from sloserve.services.stack import Stack

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_two_rates_give_vllm_keys_a_result_line_each_and_the_three_plots(
        start_stack: Callable[..., Stack], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    stack = start_stack(policy="sarathi")
    trace = tmp_path / "tiny.csv"
    trace.write_text("prompt_len,output_len\n" + "".join(f"{40 + 30 * k},{4 + k}\n"
                                                         for k in range(6)))
    result, plots = tmp_path / "result.jsonl", tmp_path / "plots"
    code = cli.main(["bench", "--target", stack.gateway, "--trace-file", str(trace),
                     "--request-rate", "4", "16", "--num-requests", "8",
                     "--goodput", "ttft:5000", "tpot:1000", "--json",
                     "--result-file", str(result), "--plot", str(plots)])
    assert code == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["request_rate"] for p in printed] == [4.0, 16.0]
    for p in printed:
        assert set(p) == SCALAR_KEYS and p["endpoint"] == "grpc"
        assert p["completed"] == 8 and p["failed"] == 0
        assert p["request_goodput"] == pytest.approx(p["request_throughput"])  # generous targets
        assert 0 < p["median_ttft_ms"] <= p["p99_ttft_ms"]
        # vLLM's TPOT is our per-request mean TBT, its pooled ITL our pooled TBT gaps
        assert p["median_tpot_ms"] == pytest.approx(1000 * p["mean_tbt_p50"])
        assert p["mean_itl_ms"] == pytest.approx(1000 * p["tbt_mean"])
    saved = [json.loads(line) for line in result.read_text().splitlines()]
    assert [set(s) for s in saved] == [RESULT_KEYS, RESULT_KEYS]
    assert len(saved[0]["ttfts"]) == 8
    assert saved[0]["output_lens"] == saved[1]["output_lens"]  # one workload, two rates
    for name in (*PLOTS, RATE_PLOT):
        png = (plots / name).read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000, name


def test_requests_dropped_before_their_first_token_leave_the_duration_a_wall_time(
        start_stack: Callable[..., Stack], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sloserve.policies.ascendra import AscendraConfig

    stack = start_stack(policy="ascendra", policy_config=AscendraConfig(drop_late=True))
    trace = tmp_path / "long.csv"  # long prompts arriving together: queued ones are late
    trace.write_text("prompt_len,output_len\n" + "2000,2\n" * 8)
    t0 = time.monotonic()
    code = cli.main(["bench", "--target", stack.gateway, "--trace-file", str(trace),
                     "--qps", "200", "--num-requests", "8", "--ttft-slo", "0.3",
                     "--json", "--disable-tqdm"])
    wall = time.monotonic() - t0
    assert code == 0
    (p,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert p["dropped"] > 0 and p["completed"] > 0, p  # some dropped before any token
    assert 0 < p["duration"] <= wall, (p["duration"], wall)
    assert p["request_throughput"] == pytest.approx(p["completed"] / p["duration"])
