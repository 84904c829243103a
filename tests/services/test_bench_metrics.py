"""``sloserve bench``'s vLLM metrics (``bench_metrics``): vllm bench serve's semantics pinned on
known request timings, checked against vLLM's own ``calculate_metrics``, and the flag errors."""

from __future__ import annotations

import random

import pytest

from sloserve.request import Request, RequestStatus
from sloserve.services import cli
from sloserve.services.bench_metrics import (
    Timing,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    timing,
    vllm_metrics,
)


def _req(rid: str, prompt: int, times: list[float], status: RequestStatus) -> Request:
    r = Request(rid, arrival_time=0.0, prompt_len=prompt, output_len=max(1, len(times)))
    r.token_times, r.status = list(times), status
    r.finish_time = times[-1] if times else None
    return r


# a: 4 tokens, TTFT 200 ms, TPOT (350-200)/3 = 50 ms; b: 1 token at 900 ms;
# c: 3 tokens, TTFT 100 ms, TPOT (500-100)/2 = 200 ms; d: dropped before any token
KNOWN = [
    timing(_req("a", 10, [0.2, 0.25, 0.3, 0.35], RequestStatus.FINISHED)),
    timing(_req("b", 20, [0.9], RequestStatus.FINISHED)),
    timing(_req("c", 5, [0.1, 0.3, 0.5], RequestStatus.FINISHED)),
    timing(_req("d", 7, [], RequestStatus.DROPPED)),
]


def test_request_timing_is_ttft_e2el_and_gaps_from_the_send() -> None:
    a = KNOWN[0]
    assert a.success and (a.prompt_len, a.output_len) == (10, 4)
    assert (a.ttft, a.latency) == pytest.approx((0.2, 0.35))
    assert a.itl == pytest.approx([0.05, 0.05, 0.05]) and a.tpot == pytest.approx(0.05)
    assert KNOWN[1].tpot is None  # 1 token: no TPOT
    assert not KNOWN[3].success and KNOWN[3].ttft is None


@pytest.mark.parametrize(("targets", "good"), [
    ({"ttft": 500, "tpot": 60}, 1),  # a only: b's TTFT 900, c's TPOT 200 miss
    ({"tpot": 60}, 2),  # b's single token counts as TPOT 0 for goodput
    ({"e2el": 350}, 1),  # a's E2EL equals the target: met (value <= target)
    ({"ttft": 1000, "tpot": 1000, "e2el": 1000}, 3),  # the dropped one is never good
    ({"ttft": 0}, 0),
])
def test_goodput_counts_completed_requests_meeting_every_target_per_second(
        targets: dict[str, float], good: int) -> None:
    out = vllm_metrics(KNOWN, 2.0, targets)
    assert out["request_goodput"] == pytest.approx(good / 2.0)


def test_throughputs_and_statistics_count_completed_requests_only() -> None:
    out = vllm_metrics(KNOWN, 2.0, {}, percentiles=(50.0, 99.9))
    assert out["request_goodput"] is None  # no --goodput: null, as vLLM
    assert out["failed"] == 1
    assert (out["total_input_tokens"], out["total_output_tokens"]) == (35, 8)
    assert out["request_throughput"] == pytest.approx(1.5)
    assert out["input_throughput"] == pytest.approx(17.5)
    assert out["output_throughput"] == pytest.approx(4.0)
    assert out["total_token_throughput"] == pytest.approx(21.5)
    assert out["mean_ttft_ms"] == pytest.approx(400.0)  # (200 + 900 + 100) / 3
    assert out["median_ttft_ms"] == pytest.approx(200.0)
    assert out["mean_tpot_ms"] == pytest.approx(125.0)  # b (1 token) left out: (50 + 200) / 2
    assert out["mean_itl_ms"] == pytest.approx(110.0)  # pooled gaps 50, 50, 50, 200, 200
    assert out["mean_e2el_ms"] == pytest.approx((350 + 900 + 500) / 3)
    assert out["p50_tpot_ms"] == pytest.approx(125.0) and "p99.9_itl_ms" in out
    assert "p99_ttft_ms" not in out  # only the percentiles asked for


def test_percentile_metrics_select_which_statistics_are_reported() -> None:
    out = vllm_metrics(KNOWN, 2.0, {}, percentile_metrics=("ttft",))
    assert {k for k in out if k.endswith("_ms")} == {
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms"}


def test_nothing_completed_gives_zero_rates_and_zero_statistics() -> None:
    out = vllm_metrics(KNOWN[3:], None, {"ttft": 10})
    assert (out["request_throughput"], out["request_goodput"], out["mean_ttft_ms"]) == (0, 0, 0)


def test_same_numbers_as_vllms_calculate_metrics() -> None:
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rng = random.Random(7)
    timings = list(KNOWN)
    for _ in range(60):
        if rng.random() < 0.1:
            timings.append(Timing(False, rng.randint(1, 50), 0))
            continue
        n = rng.choice([1, 1, 2, rng.randint(3, 40)])
        ttft = rng.uniform(0.01, 2.0)
        itl = [rng.uniform(0.005, 0.2) for _ in range(n - 1)]
        timings.append(Timing(True, rng.randint(1, 500), n, ttft, ttft + sum(itl), itl))
    outputs = [RequestFuncOutput(success=t.success, latency=t.latency or 0.0,
                                 output_tokens=t.output_len, ttft=t.ttft or 0.0, itl=t.itl,
                                 prompt_len=t.prompt_len) for t in timings]
    targets = {"ttft": 900.0, "tpot": 90.0, "e2el": 2500.0}
    ref, _ = serve.calculate_metrics([], outputs, 7.5, None, [50.0, 90.0, 99.0], targets)
    ours = vllm_metrics(timings, 7.5, targets, percentiles=(50.0, 90.0, 99.0))
    assert 0 < ref.request_goodput < ref.request_throughput  # the targets bite
    assert ours["failed"] == ref.failed
    for key in ("request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput"):
        assert ours[key] == pytest.approx(getattr(ref, key)), key
    assert (ours["total_input_tokens"], ours["total_output_tokens"]) == (ref.total_input,
                                                                          ref.total_output)
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert ours[f"{stat}_{m}_ms"] == pytest.approx(getattr(ref, f"{stat}_{m}_ms")), m
        for p, v in getattr(ref, f"percentiles_{m}_ms"):
            assert ours[f"p{int(p)}_{m}_ms"] == pytest.approx(v), (m, p)


@pytest.mark.parametrize("pairs", [["ttft=5"], ["foo:5"], ["ttft:abc"], ["ttft:nan"], ["tpot"]])
def test_malformed_goodput_names_the_flag(pairs: list[str]) -> None:
    with pytest.raises(ValueError, match=r"goodput \(--goodput\): .* NAME:MS"):
        parse_goodput(pairs)


def test_negative_or_repeated_goodput_targets_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--goodput.*>= 0"):
        parse_goodput(["ttft:-1"])
    with pytest.raises(ValueError, match=r"--goodput.*ttft given twice"):
        parse_goodput(["ttft:1", "ttft:2"])
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:1e4"]) == {
        "ttft": 500.0, "tpot": 50.0, "e2el": 10000.0}


def test_percentile_flags_name_themselves() -> None:
    with pytest.raises(ValueError, match=r"--percentile-metrics.*'queue'"):
        parse_percentile_metrics("ttft,queue")
    with pytest.raises(ValueError, match=r"--metric-percentiles.*'101'"):
        parse_metric_percentiles("50,101")
    assert parse_metric_percentiles("50,99.9") == (50.0, 99.9)


@pytest.mark.parametrize(("flags", "named"), [
    (["--goodput", "ttft:x"], "--goodput"),
    (["--percentile-metrics", "ttft,p"], "--percentile-metrics"),
    (["--metric-percentiles", "-1"], "--metric-percentiles"),
    (["--qps", "1", "0"], "--qps"),
    (["--qps", "inf"], "--qps"),
])
def test_bad_bench_flags_exit_2_naming_the_flag_before_sending(
        flags: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["bench", "--target", "127.0.0.1:1", "--trace", "sharegpt", "--num-requests", "2"]
    argv = base + (flags if "--qps" in flags else ["--qps", "1", *flags])
    assert cli.main(argv) == 2  # nothing listens on port 1: it failed before connecting
    assert named in capsys.readouterr().err


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("tty", "progress", "bar"), [
    (True, True, True), (False, True, False), (True, False, False)])
def test_a_progress_bar_on_a_terminal_unless_disabled(
        monkeypatch: pytest.MonkeyPatch, tty: bool, progress: bool, bar: bool) -> None:
    """vllm bench serve's tqdm bar: on a terminal only, off with --disable-tqdm."""
    import asyncio
    import sys
    from typing import Any

    from sloserve.services.bench_cmd import send_all

    err = _Terminal(tty)
    monkeypatch.setattr(sys, "stderr", err)
    reqs = [Request(f"r{k}", arrival_time=0.0, prompt_len=8, output_len=2) for k in range(3)]

    async def one(req: Request, t0: float, pbar: Any) -> None:
        if pbar is not None:
            pbar.update(1)

    asyncio.run(send_all(reqs, one, progress=progress, label="4 req/s"))
    assert ("3/3" in err.text and "4 req/s" in err.text) == bar, err.text
    assert bar or err.text == ""
