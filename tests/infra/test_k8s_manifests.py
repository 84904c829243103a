"""infra/k8s (CPU) and infra/k8s/gpu (``render --gpu-variant``) against the Kubernetes 1.37
schemas (``kubernetes-validate``, which ships them), plus what the schemas cannot say:
pinned images, probes and resources on every container, the router (the one Controller)
following the instance registry in Redis and the frontends behind the public Service, the
OpenAI port exposed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"
K8S_VERSION = "1.37.0"


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _schema_errors(docs: list[dict[str, Any]]) -> list[str]:
    errors = []
    for d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{d['kind']}/{d['metadata']['name']}: {exc.message}")
    return errors


@pytest.fixture(params=["cpu", "gpu"])
def variant(request: pytest.FixtureRequest) -> Path:
    return K8S if request.param == "cpu" else K8S / "gpu"


@pytest.fixture
def manifests(variant: Path) -> list[dict[str, Any]]:
    return _docs((variant / "sloserve.yaml").read_text())


def _containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for d in docs if d["kind"] in ("Deployment", "StatefulSet")
            for c in d["spec"]["template"]["spec"]["containers"]]


def test_every_manifest_passes_the_kubernetes_schema(manifests: list[dict[str, Any]]) -> None:
    assert len(manifests) >= 10
    assert _schema_errors(manifests) == []


def test_the_schema_check_catches_a_broken_manifest() -> None:
    text = (K8S / "sloserve.yaml").read_text()
    broken = text.replace("containerPort: 50051", 'containerPort: "fifty"', 1)
    assert broken != text
    assert any("frontend" in e for e in _schema_errors(_docs(broken)))
    typo = text.replace("readinessProbe:", "readinesProbe:", 1)
    assert typo != text
    assert _schema_errors(_docs(typo))  # strict: an unknown field is an error


def test_every_container_has_a_pinned_image_probes_and_resources(
        variant: Path, manifests: list[dict[str, Any]]) -> None:
    pyproject = (K8S.parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)  # type: ignore[union-attr]
    containers = _containers(manifests)
    # redis, sentinel, perf-model, executor, scheduler, router, frontend
    assert sorted(c["name"] for c in containers) == [
        "executor", "frontend", "perfmodel", "redis", "router", "scheduler", "sentinel"]
    for c in containers:
        name, _, tag = c["image"].partition(":")
        assert tag and tag != "latest", c["name"]
        if name.startswith("sloserve-"):
            assert tag == version, c["name"]
        assert "readinessProbe" in c and "livenessProbe" in c, c["name"]
        assert set(c["resources"]) == {"requests", "limits"}, c["name"]
    kustomize = yaml.safe_load((variant / "kustomization.yaml").read_text())
    assert kustomize["resources"] == ["sloserve.yaml"]
    pinned = {i["name"]: i["newTag"] for i in kustomize["images"]}
    assert pinned == {c["image"].partition(":")[0]: c["image"].partition(":")[2]
                      for c in containers}


def test_the_router_follows_the_registry_and_the_frontends_serve_openai_on_8000(
        manifests: list[dict[str, Any]]) -> None:
    """``up --frontends N``'s shape (issue 33): one router (the one Controller: 1 replica,
    never two at once) reads the registry in Redis (REDIS_URL) and waits for every instance
    of the description; each scheduler registers the name its pod is dialled by
    (``$(POD_NAME).instance``, issue 34 item 2); the frontends, behind the public Service
    and its HPA, are given the router's address and no Redis. No gateway Deployment: a
    gateway per replica would be a Controller per replica."""
    by = {(d["kind"], d["metadata"]["name"]): d for d in manifests}
    assert ("Deployment", "gateway") not in by
    router_spec = by["Deployment", "router"]["spec"]
    assert router_spec["replicas"] == 1 and router_spec["strategy"] == {"type": "Recreate"}
    router = router_spec["template"]["spec"]["containers"][0]
    assert router["args"][0] == "sloserve.services.router"
    assert "--scheduler" not in router["args"]
    assert not [a for a in router["args"] if "instance-" in a]  # nothing hard-coded
    env = {e["name"]: e for e in router["env"]}
    assert env["REDIS_URL"]["value"].startswith("redis+sentinel://")
    assert "schedulers" not in by["ConfigMap", "sloserve"]["data"]
    replicas = sum(by["StatefulSet", f"instance-{r}"]["spec"]["replicas"]
                   for r in ("lp", "hp") if ("StatefulSet", f"instance-{r}") in by)
    assert router["args"][router["args"].index("--min-instances") + 1] == str(replicas)
    assert {p["port"] for p in by["Service", "router"]["spec"]["ports"]} == {50052}
    pods = [d for k, d in by.items() if k[0] == "StatefulSet" and k[1].startswith("instance-")]
    for sts in pods:
        sched = next(c for c in sts["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "scheduler")
        args = sched["args"]
        assert args[args.index("--advertise") + 1] == "$(POD_NAME).instance"
        assert args[args.index("--instance-id") + 1] == "$(POD_NAME)"
    fronts = by["Deployment", "frontend"]["spec"]
    front = fronts["template"]["spec"]["containers"][0]
    assert front["args"][0] == "sloserve.services.frontend"
    assert front["args"][front["args"].index("--router") + 1] == "router:50052"
    assert "--min-instances" not in front["args"]
    assert not {"REDIS_URL", "REDIS_PASSWORD"} & {e["name"] for e in front["env"]}
    hpa = by["HorizontalPodAutoscaler", "frontend"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "frontend"
    assert hpa["minReplicas"] == fronts["replicas"] >= 2
    assert front["args"][front["args"].index("--http-port") + 1] == "8000"
    public = by["Service", "gateway"]["spec"]
    assert public["selector"] == {"app": "frontend"}
    assert {p["port"] for p in public["ports"]} == {50051, 8000}

    def sources(name: str) -> tuple[set[str], set[int]]:
        rule = by["NetworkPolicy", name]["spec"]["ingress"][0]
        return ({f["podSelector"]["matchLabels"]["app"] for f in rule.get("from", [])},
                {p["port"] for p in rule["ports"]})

    assert sources("frontend-from-clients") == (set(), {50051, 8000})  # from anyone
    assert sources("router-from-frontends") == ({"frontend"}, {50052})
    # tokens go from a scheduler straight to the frontend that owns the request
    assert sources("scheduler-from-router-and-frontends") == ({"router", "frontend"}, {50071})
    assert sources("redis-from-services") == (
        {"instance", "perfmodel", "router", "redis"}, {6379, 26379})
    assert not [k for k in by if k[0] == "NetworkPolicy" and "gateway" in k[1]]


def test_each_executor_draws_the_noise_stream_of_its_pod_ordinal(
        manifests: list[dict[str, Any]]) -> None:
    """As ``up`` gives executor k ``--seed S --instance k``: one seed for the StatefulSet,
    the instance from the pod-index label (no shell in args: Kubernetes expands $(VAR))."""
    ex = next(c for c in _containers(manifests) if c["name"] == "executor")
    args = ex["args"]
    assert args[args.index("--seed") + 1] == "0"
    assert args[args.index("--instance") + 1] == "$(POD_INDEX)"
    env = {e["name"]: e for e in ex["env"]}
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"


def test_redis_runs_with_sentinel_and_every_service_follows_the_master_through_it(
        manifests: list[dict[str, Any]]) -> None:
    """Issue 34, item 4: Redis with Sentinel: 3 pods of redis-server + sentinel, services
    on a redis+sentinel:// URL naming every sentinel, the password from the Secret."""
    by = {(d["kind"], d["metadata"]["name"]): d for d in manifests}
    redis = by["StatefulSet", "redis"]["spec"]
    assert redis["replicas"] == 3 and redis["serviceName"] == "redis"
    pod = redis["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["redis", "sentinel"]
    assert "--sentinel" in pod["containers"][1]["args"]
    init = pod["initContainers"][0]["command"][-1]
    assert "sentinel monitor sloserve $master 6379 2" in init
    assert "replicaof $master 6379" in init
    sentinels = ",".join(f"redis-{k}.redis:26379" for k in range(3))
    for c in _containers(manifests):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if c["name"] in ("redis", "sentinel", "frontend"):  # a frontend reads no Redis
            assert "REDIS_URL" not in env, c["name"]
            continue
        assert env["REDIS_URL"] == f"redis+sentinel://:$(REDIS_PASSWORD)@{sentinels}/sloserve/0"
    assert by["Service", "redis"]["spec"]["clusterIP"] == "None"
