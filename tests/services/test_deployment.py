"""One ``Deployment`` (issue 32, item 2): the TBT SLO and every default reach a scheduler
however it is started, ``simulate`` and ``up`` agree on every default, and the JSON a
service is handed is checked field by field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import fields
from pathlib import Path

import grpc
import pytest
from redis_source import redis_url

from sloserve.deployment import DEPLOYMENT_ENV, Deployment
from sloserve.policies import get_spec
from sloserve.services.auth import INTERNAL_TOKEN_ENV, metadata, new_token
from sloserve.services.cli import build_parser
from sloserve.services.proto import scheduler_grpc, scheduler_pb2
from sloserve.services.rpc import PARENT_PID_ENV, wait_healthy
from sloserve.services.scheduler.main import build_parser as scheduler_parser
from sloserve.services.scheduler.main import deployment_of, policy_of
from sloserve.services.sim_cmd import config_from_args as sim_config
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port
from sloserve.services.up_cmd import config_from_args as up_config
from sloserve.sim.config import SimConfig

SCHED = ["--port", "1", "--instance-id", "lp0", "--executor", "x:1"]


def test_a_scheduler_started_alone_runs_its_policy_under_the_gateways_tbt_slo(
        tmp_path: Path) -> None:
    """As compose and Kubernetes start it: a sim executor and a scheduler, by hand, the
    scheduler given the gateway's ``--tbt-slo 0.5``. Its policy's token budget is the
    relaxed SLO's 2048 (Sarathi-Serve §5), not the default SLO's 512, and its Status
    reports the Deployment it runs."""
    token, prefix = new_token(), f"test-dep-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, INTERNAL_TOKEN_ENV: token, PARENT_PID_ENV: str(os.getpid()),
           "REDIS_URL": redis_url()}
    env.pop(DEPLOYMENT_ENV, None)
    pe, ps = free_port(), free_port()
    while ps == pe:
        ps = free_port()
    common = ["--host", "127.0.0.1", "--prefix", prefix]
    log = (tmp_path / "services.log").open("wb")
    procs = [subprocess.Popen([sys.executable, "-m", "sloserve.services.executor",
                               "--port", str(pe), "--backend", "sim", *common],
                              env=env, stdout=log, stderr=log)]
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sloserve.services.scheduler", "--port", str(ps),
             "--instance-id", "lp0", "--policy", "sarathi", "--executor", f"127.0.0.1:{pe}",
             "--perf-model", "roofline", "--tbt-slo", "0.5", *common],
            env=env, stdout=log, stderr=log))
        wait_healthy(f"127.0.0.1:{ps}", "", 120)
        with grpc.insecure_channel(f"127.0.0.1:{ps}") as ch:
            st = scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                        metadata=metadata(token))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)
        log.close()
    assert json.loads(st.policy_config)["token_budget"] == 2048
    dep = Deployment.from_json(st.deployment)
    assert (dep.policy, dep.tbt_slo, dep.prefix_caching, dep.admission) == (
        "sarathi", 0.5, True, None)


def test_a_handed_deployment_reaches_the_policy_and_a_flag_overrides_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``$SLOSERVE_DEPLOYMENT`` (compose, Kubernetes) or ``--deployment`` (``up``): its TBT
    SLO resolves slack's ``tail_tbt`` and the seeds' budgets; a flag beside it wins."""
    handed = Deployment(policy="slack", tbt_slo=0.4, instances=3).to_json()
    monkeypatch.setenv(DEPLOYMENT_ENV, handed)
    dep = deployment_of(scheduler_parser().parse_args(SCHED))
    assert (dep.policy, dep.tbt_slo, dep.instances) == ("slack", 0.4, 3)
    assert policy_of(dep, "lp").config.tail_tbt == 0.4  # type: ignore[attr-defined]
    dep = deployment_of(scheduler_parser().parse_args([*SCHED, "--tbt-slo", "0.3"]))
    assert policy_of(dep, "lp").config.tail_tbt == 0.3  # type: ignore[attr-defined]
    monkeypatch.delenv(DEPLOYMENT_ENV)
    dep = deployment_of(scheduler_parser().parse_args([*SCHED, "--deployment", handed,
                                                       "--policy", "sarathi"]))
    assert policy_of(dep, "lp").config.token_budget == 2048  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "named"), [
    ('{"tbt_slo": -1}', "tbt_slo: must be > 0"),
    ('{"polcy": "slack"}', "unknown field 'polcy'"),
    ('{"policy": "sarathi", "policy_config": {"gamma": 1}}', "'gamma' is not a knob"),
    ('{"prefix_caching": "yes"}', "prefix_caching: must be bool"),
    ("[1]", "must be a JSON object"),
    ("{", "not JSON"),
])
def test_a_bad_handed_deployment_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="--deployment") as exc:
        deployment_of(scheduler_parser().parse_args([*SCHED, "--deployment", text]))
    assert named in str(exc.value)


def test_the_deployment_json_round_trips_every_field() -> None:
    from sloserve.admission import Admission
    from sloserve.policies.slack import SlackConfig

    dep = Deployment(policy="slack", policy_config=SlackConfig(tail_tbt=0.2), instances=2,
                     model="llama-3-8b", num_blocks=900, prefix_caching=False,
                     prefix_routing=True, admission=Admission(10, 1000, False), overlap=True,
                     refit_interval=0.5, ttft_slo=None, tbt_slo=0.3, seed=4, noise_cv=0.0)
    assert Deployment.from_json(dep.to_json()) == dep


def test_simulate_and_up_resolve_the_same_deployment_from_the_same_flags(
        tmp_path: Path) -> None:
    """No flag given: every Deployment field the same in ``simulate`` and ``up`` (prefix
    caching on, admission off, refits every REFIT_EVERY batches, one model, one noise);
    each flag turns the same field in both."""
    parse = build_parser().parse_args
    sim = ["simulate", "--policy", "sarathi", "--trace", "sharegpt", "--qps", "1"]
    up = ["up", "--policy", "sarathi", "--log-dir", str(tmp_path)]

    def both(*flags: str) -> tuple[Deployment, Deployment]:
        return (sim_config(parse([*sim, *flags]), 1.0).deployment(),
                up_config(parse([*up, *flags])).deployment())

    default = Deployment(policy="sarathi", policy_config=get_spec("sarathi").config_cls())
    s, u = both()
    assert s == u == default
    assert (s.prefix_caching, s.admission, s.refit_interval) == (True, None, None)
    for flags in (("--no-prefix-caching",), ("--admission",), ("--refit-interval", "0.5"),
                  ("--tbt-slo", "0.3"), ("--noise-cv", "0.1"), ("--max-queued-requests", "7"),
                  ("--token-budget", "300")):
        s, u = both(*flags)
        assert s == u != default, flags


def test_sim_and_stack_configs_restate_no_deployment_field() -> None:
    own = {f.name for f in fields(Deployment)}
    for cls in (SimConfig, StackConfig):
        assert issubclass(cls, Deployment)
        assert not {name for name in cls.__dataclass_fields__ if name in own
                    and cls.__dataclass_fields__[name] is not Deployment.__dataclass_fields__[name]
                    }, cls


def test_up_hands_every_service_the_resolved_deployment() -> None:
    stack = Stack(StackConfig(policy="slack", tbt_slo=0.3))
    stack.plan()
    for name, svc in stack.services.items():
        got = Deployment.from_json(svc.argv[svc.argv.index("--deployment") + 1])
        assert got.tbt_slo == 0.3, name
        assert got.policy_config == get_spec("slack").config_cls(tail_tbt=0.3).resolved(
            tbt_slo=0.3), name


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            name = line[:-1]
        out[name] = out.get(name, "") + line + "\n"
    return out


@pytest.mark.parametrize("command", ["simulate", "capacity", "compare", "up"])
def test_help_shows_every_default_and_groups_policy_knobs_under_their_policy(
        command: str) -> None:
    """Issue 35, item 4: each flag with a default says it; a knob one policy owns is listed
    under that policy, one several share in a group of its own."""
    import argparse

    from sloserve.policies.flags import all_knobs, flag

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = sub.format_help()
    sections = _sections(text)
    for name, owners in all_knobs().items():
        where = (f"{owners[0][0].name} policy knobs" if len(owners) == 1
                 else "policy knobs shared by several policies")
        assert f"  {flag(name)}" in sections[where], (name, where)
    for action in sub._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        opt = ", ".join(action.option_strings)
        block = text[text.index(f"  {opt}"):].split("\n  -", 1)[0]
        assert "default" in block, (command, opt)


def test_compare_names_the_deployment_it_ran(capsys: pytest.CaptureFixture[str]) -> None:
    from sloserve.services.cli import main

    assert main(["compare", "--num-requests", "20", "--qps", "2"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "3 x llama-3-8b on a100" in head, head
