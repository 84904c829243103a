"""Every knob ``simulate`` accepts reaches the live stack: one declaration per policy,
flags generated from it, ``up`` hands each scheduler service the same config."""

from __future__ import annotations

import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloserve.policies import PolicyConfig, get_spec, policy_names
from sloserve.policies.base import knob_types
from sloserve.policies.flags import config_to_argv
from sloserve.services.cli import build_parser, main
from sloserve.services.scheduler.main import build_parser as scheduler_parser
from sloserve.services.scheduler.main import policy_from_args
from sloserve.services.stack import Stack
from sloserve.services.up_cmd import config_from_args as up_config

ROOT = Path(__file__).resolve().parents[2]
SIM = ["--trace", "sharegpt", "--qps", "1", "--num-requests", "10"]


def _other(cls: type[PolicyConfig], name: str, default: Any) -> Any:
    """A valid value of knob ``name`` that is not its default."""
    f = next(f for f in fields(cls) if f.name == name)
    hint = knob_types(cls)[name]
    if hint is bool:
        return not default
    if "choices" in f.metadata:
        return next(c for c in f.metadata["choices"] if c != default)
    if default is None:
        return 777
    if hint is float:
        return min(default + 0.25, f.metadata.get("max", default + 0.25))
    return default + 3


def non_default(policy: str) -> PolicyConfig:
    cls = get_spec(policy).config_cls
    return cls(**{f.name: _other(cls, f.name, f.default) for f in fields(cls)})


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "ascendra", "accelgen", "slack"])
def test_simulate_flags_build_the_config_with_every_knob_changed(policy: str) -> None:
    from sloserve.services.sim_cmd import config_from_args

    want = non_default(policy)
    assert all(getattr(want, f.name) != f.default for f in fields(want))
    args = build_parser().parse_args(["simulate", "--policy", policy, *SIM,
                                      *config_to_argv(want)])
    assert config_from_args(args).policy_config == want


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "ascendra", "accelgen", "slack"])
def test_up_hands_every_scheduler_the_config_simulate_accepts(policy: str,
                                                              tmp_path: Path) -> None:
    want, spec = non_default(policy), get_spec(policy)
    hp = 1 if spec.has_role("hp") else 0
    args = build_parser().parse_args(["up", "--policy", policy, "--instances", "3",
                                      "--hp-instances", str(hp), "--log-dir", str(tmp_path),
                                      *config_to_argv(want)])
    stack = Stack(up_config(args))
    stack.plan()
    scheds = [s for name, s in stack.services.items() if name.startswith("scheduler-")]
    assert len(scheds) == 3
    for svc in scheds:
        assert svc.argv[:3] == [sys.executable, "-m", "sloserve.services.scheduler"]
        sargs = scheduler_parser().parse_args(svc.argv[3:])
        from sloserve.policies.flags import config_from_args

        assert config_from_args(sargs.policy, sargs) == want
        assert policy_from_args(sargs).config == spec.make(sargs.role, want, num_hp=hp).config


def test_up_resolves_the_token_budget_from_the_tbt_slo_as_simulate(tmp_path: Path) -> None:
    def budget(*flags: str) -> int | None:
        args = build_parser().parse_args(["up", "--log-dir", str(tmp_path), *flags])
        return up_config(args).resolved_policy_config().token_budget  # type: ignore[attr-defined, no-any-return]

    assert budget() == 512
    assert budget("--tbt-slo", "0.5") == 2048
    assert budget("--tbt-slo", "0.5", "--token-budget", "300") == 300


def test_a_foreign_knob_is_rejected_naming_it_and_the_policys_knobs(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--policy", "sarathi", *SIM, "--value-function", "sjf"])
    err = capsys.readouterr().err
    assert rc == 2
    assert ("--value-function: not a knob of policy 'sarathi' "
            "(its knobs: --max-num-seqs, --token-budget)") in err
    sargs = scheduler_parser().parse_args(["--port", "1", "--instance-id", "lp0",
                                           "--executor", "x:1", "--policy", "vllm",
                                           "--gamma", "1.0"])
    with pytest.raises(ValueError, match="^--gamma: not a knob of policy 'vllm'"):
        policy_from_args(sargs)


def test_a_misspelt_knob_is_an_error_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--policy", "ascendra", *SIM, "--value-fuction", "sjf"])
    assert exc.value.code == 2 and "--value-fuction" in capsys.readouterr().err


def test_an_invalid_knob_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--policy", "ascendra", *SIM, "--lp-max-num-seqs", "0"])
    assert rc == 2 and "--lp-max-num-seqs: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--policy", "ascendra", *SIM, "--value-function", "edff"])


def test_compare_gives_each_knob_to_the_policies_that_have_it() -> None:
    from sloserve.services.sim_cmd import config_from_args

    args = build_parser().parse_args(["compare", "--value-function", "sjf", "--gamma", "0.5"])
    for policy in policy_names():
        args.policy, args.hp_instances = policy, get_spec(policy).default_hp(args.instances)
        cfg = config_from_args(args, strict=False).policy_config
        assert getattr(cfg, "value_function", "sjf") == "sjf"
        assert getattr(cfg, "gamma", 0.5) == 0.5


def _scheduler_commands() -> list[list[str]]:
    out: list[list[str]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("command", "args") and isinstance(value, list) and value \
                        and value[0] == "sloserve.services.scheduler":
                    out.append([str(v) for v in value[1:]])
                else:
                    walk(value)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))
    for path in sorted((ROOT / "infra" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            walk(doc)
    return out


def test_compose_and_k8s_schedulers_use_only_flags_the_scheduler_accepts() -> None:
    commands = _scheduler_commands()
    assert len(commands) >= 4  # compose: 2 LP + 1 HP; k8s: the instance StatefulSet
    for argv in commands:
        args = scheduler_parser().parse_args(argv)  # an unknown flag exits
        policy_from_args(args)  # and every knob belongs to the policy


NAME = "|".join(re.escape(n) for n in policy_names())
COMPARISON = re.compile(
    rf"""(==|!=)\s*f?["']({NAME})\b|["']({NAME})["']\s*(==|!=|\bin\b)"""
    rf"""|["']({NAME})-(lp|hp)["']|f["']({NAME})-\{{""")
# membership in a literal list of names; "for p in (...)" iterates and is fine
IN_LIST = re.compile(rf"""(\bfor\s+[\w\s,()]+?\s+)?\bin\s*[(\[{{]\s*f?["']({NAME})["']""")


def compares(line: str) -> bool:
    return bool(COMPARISON.search(line)) or any(m.group(1) is None
                                                 for m in IN_LIST.finditer(line))


def test_no_policy_name_is_compared_outside_the_policies_package() -> None:
    policies = ROOT / "shared" / "sloserve" / "policies"
    bad = []
    for top in ("shared", "services", "infra"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if policies in path.parents or "v1" in path.parts:
                continue
            for k, line in enumerate(path.read_text().splitlines(), 1):
                if compares(line):
                    bad.append(f"{path.relative_to(ROOT)}:{k}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_the_comparison_pattern_catches_the_old_forms() -> None:
    for line in ('if cfg.policy == "ascendra":', 'x = p != "vllm"', 'f"ascendra-{role}"',
                 'make_policy("ascendra-lp")', 'if policy in ("sarathi", "vllm"):'):
        assert compares(line), line
    for line in ('p.add_argument("--policy", default="sarathi")',
                 'for p in ("vllm", "sarathi"):', '[f(p) for p in ("vllm", "sarathi")]'):
        assert not compares(line), line


PLAN = ["plan", "--model", "llama-2-7b", "--gpu", "a100", "--gpus", "1", "--ttft-slo", "2",
        "--tpot-slo", "0.1", "--input-len", "64", "--output-len", "8", "--mode", "accurate"]


def test_plan_gives_each_knob_to_the_chosen_policies_that_have_it() -> None:
    from sloserve.plan.accurate import AccurateEvaluator
    from sloserve.plan.strategies import COLLOCATED, Strategy
    from sloserve.services.plan_cmd import _scenario, policy_configs

    args = build_parser().parse_args([*PLAN, "--policies", "sarathi,ascendra",
                                      "--value-function", "ljf", "--no-hp-elastic"])
    configs = policy_configs(args)
    ev = AccurateEvaluator(_scenario(args), policy_configs=configs)
    cfg = ev.policy_config(Strategy(COLLOCATED, 2, 1, 16, policy="ascendra", hp_instances=1))
    assert (cfg.value_function, cfg.hp_elastic) == ("ljf", False)  # type: ignore[attr-defined]
    assert (cfg.max_num_seqs, cfg.token_budget) == (16, 512)  # type: ignore[attr-defined]
    assert configs["sarathi"] == get_spec("sarathi").config_cls()


@pytest.mark.parametrize(("flags", "message"), [
    (["--token-budget", "100"], "--token-budget: plan searches it (--token-budgets)"),
    (["--gamma", "0.5"], "--gamma: not a knob of any of --policies"),
])
def test_plan_rejects_a_searched_or_foreign_knob(flags: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--policies", "vllm,sarathi", *flags]) == 2
    assert message in capsys.readouterr().err
