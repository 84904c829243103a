"""``--workers``: the split run's summary is the one-process summary; the rest is refused.

Every field is compared for equality but ``sim_wall_s`` and the fields only a split
run has (its processes' CPU and memory), except float sums that the split adds in
another order: the KV-utilisation sum over iterations, and in streaming mode the
sketches' running sums behind the means. Each is a sum of ``n`` non-negative terms;
two orders of summing them differ by at most ``2 (n - 1) u`` of the sum (u = 2**-53,
the recursive-summation bound, Higham §4.2), so they are compared with that relative
tolerance, ``n`` bounded by the iterations or the output tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import sloserve.sim.simulator as simulator
from sloserve.admission import Admission
from sloserve.batch import BatchShape
from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.regression import AscendraRegression
from sloserve.services.cli import main
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate
from sloserve.sim.split import PartObservations

SPLIT_ONLY = ("sim_wall_s", "workers", "worker_cpu_s", "worker_peak_rss_mb",
              "driver_peak_rss_mb")
U = 2.0 ** -53

CASES = {
    # the 1M run's configuration, small: per-instance noise streams, streaming metrics
    "sarathi_4x_stream": SimConfig(policy="sarathi", trace="sharegpt", instances=4, qps=6.0,
                                   num_requests=600, ttft_slo=1.0, tbt_slo=0.15,
                                   metrics="stream", noise_streams="instance", seed=3),
    # 3 instances in 2 parts (2 + 1), KV pressure: preemptions, exact mode, no noise
    "vllm_3x_kv_exact": SimConfig(policy="vllm", trace="sharegpt", instances=3, qps=9.0,
                                  num_requests=400, num_blocks=1200, noise_cv=0.0, seed=1),
    # prefix caching on each instance, heterogeneous SLOs drawn from the ground truth
    "orca_multiturn_hetero": SimConfig(policy="orca", trace="multiturn", instances=4,
                                       qps=8.0, num_requests=400, slo_mix="hetero",
                                       noise_streams="instance", seed=2),
    # a policy that predicts, from the frozen roofline (its predictions never change)
    "accelgen_roofline": SimConfig(policy="accelgen", trace="sharegpt", instances=2, qps=5.0,
                                   num_requests=300, perf_model="roofline",
                                   noise_streams="instance", metrics="stream", seed=4),
}


def _tolerance(key: str, one: dict[str, Any]) -> float:
    """Relative tolerance of ``key``: 0 (equal) unless it comes from a float sum."""
    if key == "kv_utilization":
        return 2 * one["iterations"] * U
    if key.endswith("_mean") and one.get("metrics") == "stream":
        return 2 * (one["output_tokens"] + one["requests"]) * U
    return 0.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_workers_give_the_one_process_summary(name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator, "FOLD_EVERY", 7)  # many folds (forked workers inherit it)
    cfg = CASES[name]
    one = simulate(cfg)
    two = simulate(dataclasses.replace(cfg, workers=2))
    assert two["workers"] == 2 and len(two["worker_cpu_s"]) == 2
    assert set(two) - set(SPLIT_ONLY) == set(one) - {"sim_wall_s"}
    assert one["completed"] > 0
    for key, want in one.items():
        if key in SPLIT_ONLY:
            continue
        tol = _tolerance(key, one)
        if tol and want is not None:
            assert two[key] == pytest.approx(want, rel=tol, abs=0.0), key
        else:
            assert two[key] == want, key


def test_every_instance_in_its_own_process_too() -> None:
    cfg = CASES["sarathi_4x_stream"]
    one, four = simulate(cfg), simulate(dataclasses.replace(cfg, workers=4))
    for key in ("requests", "completed", "good", "output_tokens", "iterations", "ttft_p99",
                "tbt_p99", "duration", "sim_time_s", "preemptions"):
        assert four[key] == one[key], key


def _base(**kw: Any) -> SimConfig:
    cfg = dict(policy="sarathi", trace="sharegpt", instances=3, qps=3.0, num_requests=50,
               noise_streams="instance", workers=2)
    cfg.update(kw)
    return SimConfig(**cfg)  # type: ignore[arg-type]


REFUSED = {
    "hp_instances": (dict(policy="ascendra", hp_instances=1), "--hp-instances"),
    "prefix_routing": (dict(prefix_routing=True), "--prefix-routing"),
    "admission": (dict(admission=Admission()), "--admission"),
    "overlap": (dict(overlap=True), "--overlap"),
    "overhead": (dict(overhead_profile="gaps.json"), "--overhead-profile"),
    "run_noise": (dict(noise_streams="run"), "--noise-streams instance"),
    "online_model": (dict(policy="slack"), "perf model"),
    "too_many": (dict(workers=4), "--instances 3"),
    "records": (dict(record_decisions=True), "record_decisions"),
    "timing_object": (dict(timing=ProfileTiming("llama-3-8b", "a100")), "SimConfig.timing"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_configurations_are_refused_in_one_line(name: str) -> None:
    kw, needle = REFUSED[name]
    with pytest.raises(ValueError) as err:
        simulate(_base(**kw))
    msg = str(err.value)
    assert msg.startswith("--workers 2") or msg.startswith("--workers 4"), msg
    assert needle in msg and "\n" not in msg


def test_the_cli_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--policy", "accelgen", "--trace", "sharegpt", "--instances", "2",
               "--qps", "2", "--num-requests", "20", "--workers", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--workers 2" in err


def test_a_part_never_lets_a_policy_read_the_online_model() -> None:
    """Belt and braces for ``Policy.reads_perf_model``: a read in a part is an error."""
    online = AscendraRegression(get_model("llama-3-8b"), get_hardware("a100"))
    shape = BatchShape(prefills=((128, 0),))
    with pytest.raises(RuntimeError, match="--workers"):
        PartObservations(online).predict(shape)
    with pytest.raises(RuntimeError, match="--workers"):
        _ = PartObservations(online).num_samples
    frozen = AscendraRegression(get_model("llama-3-8b"), get_hardware("a100"),
                                refit_every=1 << 62)
    assert PartObservations(frozen).predict(shape) == frozen.predict(shape)
