"""docker-compose.yml and infra/k8s hand every service the one Deployment (issue 32, item 2):
each scheduler, parsed with the flags and ``$SLOSERVE_DEPLOYMENT`` its container gets,
runs its policy under the gateway's TBT SLO, as under ``up``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloserve.deployment import DEPLOYMENT_ENV
from sloserve.policies import get_spec
from sloserve.services import deployment_flags
from sloserve.services.frontend.server import build_parser as frontend_parser
from sloserve.services.gateway.server import build_parser as gateway_parser
from sloserve.services.scheduler.main import build_parser as scheduler_parser
from sloserve.services.scheduler.main import deployment_of, policy_of

ROOT = Path(__file__).resolve().parents[2]


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` (the only form the Deployment uses)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), text)


def _compose(env: dict[str, str]) -> list[tuple[str, list[str], dict[str, str]]]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    out = []
    for name, svc in services.items():
        if not str(svc.get("command", [""])[0]).startswith("sloserve.services."):
            continue
        environ = {k: _interpolate(str(v), env) for k, v in svc.get("environment", {}).items()}
        out.append((name, [str(a) for a in svc["command"]], environ))
    return out


def _k8s() -> list[tuple[str, list[str], dict[str, str]]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "infra" / "k8s" / "sloserve.yaml").read_text())
            if d]
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    out = []
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            if not c.get("args", [""])[0].startswith("sloserve.services."):
                continue
            environ = {}
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref is not None:
                    environ[e["name"]] = config[ref["key"]]
            args = [str(a).replace("$(POD_NAME)", "instance-0").replace("$(POD_INDEX)", "0")
                    for a in c["args"]]
            out.append((c["name"], args, environ))
    return out


def _check(services: list[tuple[str, list[str], dict[str, str]]],
           monkeypatch: pytest.MonkeyPatch) -> tuple[float | None, int]:
    def handed(environ: dict[str, str]) -> None:
        assert DEPLOYMENT_ENV in environ
        monkeypatch.setenv(DEPLOYMENT_ENV, environ[DEPLOYMENT_ENV])

    # the front door: the one gateway, or the frontends (several: every one the same)
    doors = {"sloserve.services.gateway": gateway_parser,
             "sloserve.services.frontend": frontend_parser}
    tbts = set()
    for _, gw_args, gw_env in [s for s in services if s[1][0] in doors]:
        handed(gw_env)
        tbts.add(deployment_flags.deployment_from_args(
            doors[gw_args[0]]().parse_args(gw_args[1:])).tbt_slo)
    (tbt,) = tbts
    schedulers = 0
    for name, argv, environ in services:
        handed(environ)  # every service, not only the schedulers
        if argv[0] != "sloserve.services.scheduler":
            continue
        args = scheduler_parser().parse_args(argv[1:])
        dep = deployment_of(args)
        assert dep.tbt_slo == tbt, name
        want = get_spec(dep.policy).make(
            args.role, get_spec(dep.policy).config_cls().resolved(tbt_slo=tbt),
            num_hp=dep.hp_instances).config
        assert policy_of(dep, args.role).config == want, name
        schedulers += 1
    return tbt, schedulers


@pytest.mark.parametrize("tbt", [None, "0.5"])
def test_every_compose_scheduler_runs_under_the_gateways_tbt_slo(
        tbt: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {} if tbt is None else {"SLOSERVE_TBT_SLO": tbt}
    got, schedulers = _check(_compose(env), monkeypatch)
    assert got == (0.15 if tbt is None else 0.5) and schedulers == 3


def test_every_k8s_scheduler_runs_under_the_gateways_tbt_slo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    got, schedulers = _check(_k8s(), monkeypatch)
    assert got == 0.15 and schedulers == 1


def test_a_relaxed_compose_tbt_slo_gives_every_scheduler_the_relaxed_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sarathi-Serve §5's rule, end to end from the compose file: 2048 under 0.5 s."""
    for _, argv, environ in _compose({"SLOSERVE_TBT_SLO": "0.5"}):
        if argv[0] != "sloserve.services.scheduler":
            continue
        monkeypatch.setenv(DEPLOYMENT_ENV, environ[DEPLOYMENT_ENV])
        args = scheduler_parser().parse_args(argv[1:])
        config: Any = policy_of(deployment_of(args), args.role).config
        assert config.token_budget == 2048 or args.role == "hp"
