"""``sloserve render`` (issue 34, item 4): one description renders compose and Kubernetes;
the checked-in files are its output, N instances are N scheduler + executor pairs, the
GPU variant asks for ``nvidia.com/gpu``, and a bad description is refused by key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sloserve.render import load_description, render_compose, render_k8s

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = ROOT / "infra" / "deployments"
K8S_VERSION = "1.37.0"

FOUR = """\
policy: ascendra
instances: 4
hp_instances: 2
backend: sim
"""


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _containers(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"]
            for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def _render(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sloserve.services.cli", "render", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("target", "source", "extra", "checked_in"), [
    ("compose", "local-2l1h.yaml", [], ["docker-compose.yml"]),
    ("k8s", "k8s-cpu.yaml", [], ["infra/k8s/sloserve.yaml", "infra/k8s/kustomization.yaml"]),
    ("k8s", "k8s-gpu.yaml", ["--gpu-variant"],
     ["infra/k8s/gpu/sloserve.yaml", "infra/k8s/gpu/kustomization.yaml"]),
])
def test_the_checked_in_files_are_exactly_the_render_output(
        target: str, source: str, extra: list[str], checked_in: list[str],
        tmp_path: Path) -> None:
    out = tmp_path / ("docker-compose.yml" if target == "compose" else "k8s")
    done = _render(target, f"infra/deployments/{source}", *extra, "--out", str(out))
    assert done.returncode == 0, done.stderr
    rendered = [out] if target == "compose" else [out / Path(p).name for p in checked_in]
    for path, got in zip(checked_in, rendered):
        want = (ROOT / path).read_text()
        # the header names the --out the checked-in file was rendered with
        assert got.read_text().replace(str(out), str(Path(path).parent) if target == "k8s"
                                       else path) == want, f"{path} drifted from the render"


def test_a_four_instance_deployment_renders_four_scheduler_executor_pairs() -> None:
    desc = load_description(FOUR)
    services = yaml.safe_load(render_compose(desc))["services"]
    ids = ["lp0", "lp1", "hp2", "hp3"]
    assert sorted(s for s in services if s.startswith(("executor-", "scheduler-"))) == sorted(
        [f"executor-{i}" for i in ids] + [f"scheduler-{i}" for i in ids])
    for k, iid in enumerate(ids):
        sched = services[f"scheduler-{iid}"]["command"]
        assert sched[sched.index("--executor") + 1] == f"executor-{iid}:50061"
        assert sched[sched.index("--role") + 1] == iid[:2]
        ex = services[f"executor-{iid}"]["command"]
        assert ex[ex.index("--instance") + 1] == str(k)  # noise stream k, as `up`
    gw = services["gateway"]["command"]  # the registry, not a fixed list (issue 34, item 2)
    assert "--scheduler" not in gw and gw[gw.index("--min-instances") + 1] == "4"
    assert "REDIS_URL" in services["gateway"]["environment"]
    for iid in ids:  # each scheduler registers the name the gateway dials it by
        sched = services[f"scheduler-{iid}"]["command"]
        assert sched[sched.index("--advertise") + 1] == f"scheduler-{iid}"
    docs = _docs(render_k8s(desc)["sloserve.yaml"])
    sets = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "StatefulSet"
            and d["metadata"]["name"] != "redis"}
    assert {n: (s["replicas"], s["ordinals"]["start"]) for n, s in sets.items()} == {
        "instance-lp": (2, 0), "instance-hp": (2, 2)}
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert "schedulers" not in config  # the gateway follows the registry in Redis
    for role in ("lp", "hp"):
        sched = next(c for c in _containers(docs)[f"instance-{role}"] if c["name"] == "scheduler")
        assert sched["args"][sched["args"].index("--advertise") + 1] == "$(POD_NAME).instance"
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_the_gpu_variant_runs_vllm_executors_on_the_cuda_image_with_one_gpu_each() -> None:
    desc = load_description((DEPLOYMENTS / "k8s-gpu.yaml").read_text())
    for gpu_variant in (False, True):
        docs = _docs(render_k8s(desc, gpu_variant)["sloserve.yaml"])
        for name, containers in _containers(docs).items():
            for c in containers:
                asks = {k for part in c["resources"].values() for k in part}
                executor = c["name"] == "executor"
                assert ("nvidia.com/gpu" in asks) == (gpu_variant and executor), (name, c["name"])
                if executor and gpu_variant:
                    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
                    assert c["image"] == desc.images["gpu_executor"]
                    assert c["args"][c["args"].index("--backend") + 1] == "vllm"
                    assert c["command"] == ["python", "-m"]


def test_every_service_mounts_its_tls_secret_and_the_frontends_autoscale() -> None:
    desc = load_description((DEPLOYMENTS / "k8s-cpu.yaml").read_text())
    docs = _docs(render_k8s(desc)["sloserve.yaml"])
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")}
    for name, pod in pods.items():
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", [])
                   if "secret" in v}
        for c in pod["containers"]:
            if c["name"] in ("redis", "sentinel"):
                continue
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            env = {e["name"]: e.get("value") for e in c["env"]}
            for var in ("SLOSERVE_INTERNAL_CA", "SLOSERVE_INTERNAL_CERT",
                        "SLOSERVE_INTERNAL_KEY"):
                mounted = mounts[str(Path(env[var]).parent)]
                assert secrets[mounted] == "sloserve-internal-tls", (name, var)
    gw = pods["frontend"]["containers"][0]
    cert = Path(gw["args"][gw["args"].index("--tls-cert") + 1])
    mounts = {m["mountPath"]: m["name"] for m in gw["volumeMounts"]}
    volumes = {v["name"]: v["secret"]["secretName"] for v in pods["frontend"]["volumes"]}
    assert volumes[mounts[str(cert.parent)]] == "sloserve-public-tls"
    assert "public-tls" not in {v["name"] for v in pods["router"]["volumes"]}
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "frontend"
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (desc.frontends, desc.max_frontends)


@pytest.mark.parametrize(("text", "key"), [
    (FOUR + "replicas: 3\n", "replicas"),
    (FOUR + "backend: tpu\n", "backend"),
    (FOUR + "images: {gateway: x:1}\n", "images.gateway"),
    (FOUR + "images: {service: sloserve-service:latest}\n", "images.service"),
    (FOUR + "frontends: 0\n", "frontends"),
    (FOUR + "frontends: 3\nmax_frontends: 2\n", "max_frontends"),
    (FOUR.replace("instances: 4", "instances: 0"), "instances"),
    ("policy: sarathi\ninstances: 2\nhp_instances: 1\n", "hp_instances"),
    (FOUR + "tbt_slo: -1\n", "tbt_slo"),
])
def test_a_bad_description_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ValueError, match=rf"^{key}:"):
        load_description(text.replace("backend: sim\n", "") if key == "backend" else text)


def test_the_cli_refuses_a_bad_description_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(FOUR + "replicas: 3\n")
    out = tmp_path / "compose.yml"
    done = _render("compose", str(bad), "--out", str(out))
    assert done.returncode == 2 and "replicas:" in done.stderr and not out.exists()
    done = _render("k8s", str(DEPLOYMENTS / "k8s-cpu.yaml"), "--gpu-variant",
                   "--out", str(tmp_path / "k8s"))
    assert done.returncode == 2 and "backend:" in done.stderr
    assert not (tmp_path / "k8s").exists()


def _controllers(desc_text: str) -> list[tuple[str, int]]:
    """``(name, most replicas it may run)`` of every rendered workload that runs a
    Controller (the gateway's or the router's), k8s (HPA ceilings counted) and compose."""
    desc = load_description(desc_text)
    docs = _docs(render_k8s(desc)["sloserve.yaml"])
    ceiling = {d["spec"]["scaleTargetRef"]["name"]: d["spec"]["maxReplicas"]
               for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    out = [(f"k8s/{d['metadata']['name']}",
            ceiling.get(d["metadata"]["name"], d["spec"].get("replicas", 1)))
           for d in docs if d["kind"] == "Deployment"
           for c in d["spec"]["template"]["spec"]["containers"]
           if c["args"][0] in ("sloserve.services.gateway", "sloserve.services.router")]
    out += [(f"compose/{name}", s.get("deploy", {}).get("replicas", 1)) for name, s in
            yaml.safe_load(render_compose(desc))["services"].items()
            if s["command"][0] in ("sloserve.services.gateway", "sloserve.services.router")]
    return out


@pytest.mark.parametrize("extra", ["", "frontends: 1\nmax_frontends: 1\n",
                                   "frontends: 3\n", "frontends: 2\nmax_frontends: 6\n"])
def test_one_controller_whatever_the_frontends(extra: str) -> None:
    """Ascendra's one ticket per HP instance and round-robin need one Controller (issue
    33): however many frontends a description asks for, and however far the HPA may scale
    them, each rendering runs exactly one gateway-or-router, never more than one replica
    (a router is replaced, not rolled: Recreate)."""
    got = _controllers(FOUR + extra)
    assert sorted(n.split("/")[0] for n, _ in got) == ["compose", "k8s"], got
    assert all(most == 1 for _, most in got), got
    docs = _docs(render_k8s(load_description(FOUR + extra))["sloserve.yaml"])
    for d in docs:
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "router":
            assert d["spec"]["strategy"] == {"type": "Recreate"}


def test_one_gateway_where_there_is_only_ever_one_else_a_router_and_frontends() -> None:
    """``frontends: 1`` in compose, and ``max_frontends: 1`` in k8s, render the one gateway
    as before (no router); more render ``up --frontends N``'s processes."""
    single = FOUR + "frontends: 1\nmax_frontends: 1\n"
    names = {d["metadata"]["name"] for d in _docs(render_k8s(load_description(single))[
        "sloserve.yaml"]) if d["kind"] == "Deployment"}
    assert names == {"perfmodel", "gateway"}
    services = yaml.safe_load(render_compose(load_description(FOUR)))["services"]
    assert "router" not in services and services["gateway"]["command"][0] == \
        "sloserve.services.gateway"
    docs = _docs(render_k8s(load_description(FOUR + "frontends: 3\n"))["sloserve.yaml"])
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert by["Deployment", "frontend"]["spec"]["replicas"] == 3
    assert by["HorizontalPodAutoscaler", "frontend"]["spec"]["minReplicas"] == 3
    assert ("Deployment", "gateway") not in by


def test_compose_with_n_frontends_runs_the_router_and_n_frontends_on_the_published_ports(
        ) -> None:
    """Compose, ``frontends: 3``: the router follows the registry (REDIS_URL, waits for
    every instance, after the schedulers are healthy); ``gateway`` publishes the ports and
    ``gateway-1``, ``gateway-2`` share its network namespace, so the three share the ports
    as ``up --frontends 3``'s do (SO_REUSEPORT); each is given the router, not Redis."""
    services = yaml.safe_load(render_compose(load_description(FOUR + "frontends: 3\n")))[
        "services"]
    router = services["router"]
    cmd = router["command"]
    assert cmd[0] == "sloserve.services.router" and cmd[cmd.index("--min-instances") + 1] == "4"
    assert cmd[cmd.index("--port") + 1] == "50052" and "--scheduler" not in cmd
    assert "REDIS_URL" in router["environment"]
    assert {n for n, c in router["depends_on"].items() if c["condition"] == "service_healthy"
            } == {"redis", *(f"scheduler-{i}" for i in ("lp0", "lp1", "hp2", "hp3"))}
    fronts = sorted(n for n, s in services.items()
                    if s["command"][0] == "sloserve.services.frontend")
    assert fronts == ["gateway", "gateway-1", "gateway-2"]
    for k, name in enumerate(fronts):
        svc = services[name]
        cmd = svc["command"]
        assert cmd[cmd.index("--router") + 1] == "router:50052"
        assert cmd[cmd.index("--index") + 1] == str(k)
        assert cmd[cmd.index("--port") + 1] == "50051" and cmd[cmd.index("--http-port") + 1] \
            == "8000"
        assert "REDIS_URL" not in svc["environment"]
        assert svc["depends_on"]["router"] == {"condition": "service_healthy"}
        if k:
            assert svc["network_mode"] == "service:gateway"
            assert "ports" not in svc and "networks" not in svc
    assert len(services["gateway"]["ports"]) == 2
    assert "front" in services["gateway"]["networks"]


def test_every_rendered_service_command_parses_with_that_services_own_flags() -> None:
    """Compose, k8s and its GPU variant, for the checked-in descriptions and 4 instances:
    an unknown flag or a bad choice (``--backend``) makes the service's parser exit."""
    from sloserve.services.executor.server import build_parser as executor
    from sloserve.services.frontend.server import build_parser as frontend
    from sloserve.services.gateway.server import build_parser as gateway
    from sloserve.services.perfmodel.server import build_parser as perfmodel
    from sloserve.services.router.server import build_parser as router
    from sloserve.services.scheduler.main import build_parser as scheduler

    parsers = {"sloserve.services.executor": executor, "sloserve.services.gateway": gateway,
               "sloserve.services.perfmodel": perfmodel,
               "sloserve.services.scheduler": scheduler,
               "sloserve.services.router": router, "sloserve.services.frontend": frontend}
    texts = [FOUR, FOUR.replace("backend: sim", "backend: vllm") + "frontends: 2\n",
             FOUR + "frontends: 1\nmax_frontends: 1\n"] + [
        p.read_text() for p in sorted(DEPLOYMENTS.glob("*.yaml"))]
    commands: list[list[str]] = []
    for text in texts:
        desc = load_description(text)
        commands += [[str(a) for a in s["command"]] for s in
                     yaml.safe_load(render_compose(desc))["services"].values()
                     if str(s["command"][0]).startswith("sloserve.")]
        for gpu in (False, True) if desc.backend == "vllm" else (False,):
            docs = _docs(render_k8s(desc, gpu)["sloserve.yaml"])
            # what Kubernetes expands $(VAR) to in a pod
            commands += [[a.replace("$(POD_INDEX)", "2").replace("$(POD_NAME)", "instance-hp-2")
                          for a in c["args"]] for cs in _containers(docs).values() for c in cs
                         if c["args"][0].startswith("sloserve.")]
    assert {c[0] for c in commands} == set(parsers)
    for argv in commands:
        parsers[argv[0]]().parse_args(argv[1:])


def test_each_backend_gets_ups_start_budget_in_probes_and_connect_timeouts() -> None:
    """A vLLM executor loads its model for minutes: the startup probe, the scheduler's,
    the gateway's, the router's and the frontends' ``--connect-timeout`` wait as long as
    ``up`` does (stack.py)."""
    from sloserve.render import START_S
    from sloserve.services.stack import start_budget

    assert START_S == {b: start_budget(b) for b in START_S}
    for backend, shape in [(b, s) for b in START_S for s in ("", "max_frontends: 1\n")]:
        desc = load_description(FOUR.replace("backend: sim", f"backend: {backend}") + shape)
        docs = _docs(render_k8s(desc)["sloserve.yaml"])
        for name, containers in _containers(docs).items():
            for c in containers:
                if c["name"] in ("redis", "sentinel"):
                    continue
                startup = c["startupProbe"]
                assert startup["periodSeconds"] * startup["failureThreshold"] == \
                    start_budget(backend), (name, c["name"])
                if c["name"] in ("scheduler", "gateway", "router", "frontend"):
                    waits = [float(c["args"][i + 1]) for i, a in enumerate(c["args"])
                             if a == "--connect-timeout"]
                    assert waits == ([start_budget(backend)] if backend != "sim" else [])


def test_a_torch_description_runs_its_executors_on_the_torch_image() -> None:
    desc = load_description(FOUR + "backend: torch\n")
    services = yaml.safe_load(render_compose(desc))["services"]
    for name, svc in services.items():
        if name.startswith("executor-"):
            assert svc["image"].startswith("sloserve-torch:") and "build" not in svc
            assert svc["entrypoint"] == ["python", "-m"]  # its own runs the executor
        elif name != "redis":
            assert svc["image"] == desc.images["service"]


def _pki(d: Path) -> dict[str, str]:
    """A CA and one certificate for 127.0.0.1, as the rendered Secrets hold them."""
    import trustme

    d.mkdir()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.crt"))
    cert.cert_chain_pems[0].write_to_path(str(d / "tls.crt"))
    cert.private_key_pem.write_to_path(str(d / "tls.key"))
    return {"SLOSERVE_INTERNAL_CA": str(d / "ca.crt"),
            "SLOSERVE_INTERNAL_CERT": str(d / "tls.crt"),
            "SLOSERVE_INTERNAL_KEY": str(d / "tls.key")}


def test_the_rendered_exec_probe_passes_a_mutual_tls_service_only_with_its_credentials(
        tmp_path: Path) -> None:
    """The perf model's probe from infra/k8s, run as the kubelet runs it, against a real
    perf-model service serving mutual TLS: SERVING with the container's files, a failure
    with a certificate from another CA (the probe is code in a string: run it)."""
    import os
    import random

    docs = _docs((ROOT / "infra" / "k8s" / "sloserve.yaml").read_text())
    (probe,) = [c["livenessProbe"]["exec"]["command"] for c in _containers(docs)["perfmodel"]]
    port = random.randint(20000, 29999)
    probe = [a.replace(":50060", f":{port}") for a in probe]
    good, rogue = _pki(tmp_path / "good"), _pki(tmp_path / "rogue")
    env = {**os.environ, **good, "SLOSERVE_INTERNAL_TOKEN": "t"}
    server = subprocess.Popen(
        [sys.executable, "-m", "sloserve.services.perfmodel", "--port", str(port),
         "--prefix", f"render-probe-{port}"], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ok = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
        for _ in range(5):  # the service may still be starting: the kubelet retries too
            if ok.returncode == 0:
                break
            ok = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr[-2000:]
        bad = subprocess.run(probe, env={**env, **rogue}, capture_output=True, text=True,
                             timeout=60)
        assert bad.returncode != 0 and "not SERVING" in bad.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
