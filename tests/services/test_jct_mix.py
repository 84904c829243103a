"""AccelGen §4.3's offline (JCT-SLO) requests reach simulate / capacity / bench via --jct-share."""

from __future__ import annotations

import argparse
import json

import pytest

from sloserve.services import bench_cmd
from sloserve.services.cli import main

HETERO = ["--model", "llama-3-8b", "--gpu", "a100", "--trace", "sharegpt", "--num-requests", "60",
          "--slo-mix", "hetero"]


def test_simulate_jct_share_makes_offline_requests_with_jct_attainment(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "accelgen", "--qps", "2", *HETERO, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jct_slo_attainment"] is None
    assert main(["simulate", "--policy", "accelgen", "--qps", "2", *HETERO, "--jct-share", "0.5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["jct_slo_attainment"] is not None and out["completed"] == 60


def test_capacity_carries_jct_share_into_the_workload_it_probes() -> None:
    from sloserve.perf.models import get_model
    from sloserve.services.cli import build_parser
    from sloserve.services.sim_cmd import config_from_args
    from sloserve.sim.simulator import build_timing, build_workload

    args = build_parser().parse_args(["capacity", "--policy", "accelgen", *HETERO,
                                      "--jct-share", "0.5"])
    cfg = config_from_args(args)
    reqs = build_workload(cfg, get_model(cfg.model), build_timing(cfg)).requests
    assert cfg.jct_share == 0.5 and any(r.slo.jct is not None for r in reqs)


def test_bench_workload_has_the_same_offline_share() -> None:
    args = argparse.Namespace(ttft_slo=None, tbt_slo=None, slo_mix="hetero", jct_share=0.5,
                              trace="sharegpt", trace_file=None, qps=2.0, num_requests=200,
                              arrival="poisson", cv=1.0, seed=0)
    reqs = bench_cmd.workload(args, "llama-3-8b", "a100")
    offline = [r for r in reqs if r.slo.jct is not None]
    assert 0.35 < len(offline) / len(reqs) < 0.65
    assert all(r.slo.ttft is None and r.slo.tbt is None for r in offline)


@pytest.mark.parametrize(("extra", "needle"), [
    (["--slo-mix", "hetero", "--jct-share", "1.5"], "must be in [0, 1]"),
    (["--slo-mix", "hetero", "--jct-share", "nan"], "must be in [0, 1]"),
    (["--jct-share", "0.3"], "--slo-mix hetero"),
])
def test_bad_jct_share_is_an_error_naming_the_flag(
        extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policy", "accelgen", "--qps", "2", "--trace", "sharegpt",
            "--num-requests", "10", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--jct-share" in err and needle in err
