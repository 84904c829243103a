"""One deployment description rendered for compose and Kubernetes (issue 34, item 4).

A description is a YAML mapping: the :class:`~sloserve.deployment.Deployment`'s fields
(policy, knobs, instances and roles, model, GPU, SLOs, ...) plus what only an
orchestrator needs: ``frontends`` (front doors; the HPA's floor), ``max_frontends``
(its ceiling), ``backend`` (sim | torch | vllm) and ``images``. :func:`render_compose`
and :func:`render_k8s` turn it into docker-compose YAML and Kubernetes manifests with one
scheduler + executor pair per instance (``instance_roles``: ``lp0, lp1, hp2``), the perf
model, the front door and Redis. The front door is what ``up`` runs: one gateway (the
Controller inside) where there is only ever one, else ``up --frontends N``'s shape (issue
33): one router holding the one Controller (following the registry) and N stateless
frontends given its address, so Ascendra's one ticket per HP instance and round-robin
hold across them (never a Controller per replica). The checked-in ``docker-compose.yml``
and ``infra/k8s/`` are their output (``sloserve render``; ``tests/infra/test_render.py``
fails on drift).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from sloserve.deployment import DEPLOYMENT_ENV, Deployment
from sloserve.policies.registry import instance_roles

BACKENDS = ("sim", "torch", "vllm")
GPU_BACKEND = BACKENDS[2]  # the backend --gpu-variant runs (the vLLM CUDA image)
IMAGE_KEYS = ("service", "executor", "gpu_executor", "redis")
EXTRA_KEYS = ("frontends", "max_frontends", "backend", "images")

GATEWAY_PORT, HTTP_PORT, PERFMODEL_PORT = 50051, 8000, 50060
EXECUTOR_PORT, SCHEDULER_PORT, REDIS_PORT = 50061, 50071, 6379
ROUTER_PORT = 50052  # several frontends: the router holding the one Controller (issue 33)
# Kubernetes: Redis with Sentinel (issue 34, item 4): a StatefulSet of REDIS_REPLICAS pods,
# each a redis-server (pod 0 the first master, the others its replicas) and a sentinel
# (quorum 2) beside it; services reach the master through the sentinels (redis+sentinel://)
SENTINEL_PORT, REDIS_REPLICAS, REDIS_MASTER, SENTINEL_QUORUM = 26379, 3, "sloserve", 2
INTERNAL_DIR, PUBLIC_DIR = "/etc/sloserve/internal", "/etc/sloserve/public"
# how long a backend's executor may take to load its model before SERVING, and so how
# long its scheduler and the gateway wait: `up`'s budgets (services/stack.py
# start_budget; tests/infra/test_render.py keeps the two in step)
START_S = {"sim": 60.0, "torch": 180.0, "vllm": 600.0}


def _version() -> str:
    try:
        return importlib.metadata.version("sloserve")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "0.1.0"


def default_images() -> dict[str, str]:
    """Pinned images (the package version; never ``:latest``). ``executor`` defaults to
    ``service`` (``backend: torch``: ``sloserve-torch``, infra/Dockerfile.torch);
    ``gpu_executor`` is the vLLM CUDA image ``--gpu-variant`` runs."""
    v = _version()
    return {"service": f"sloserve-service:{v}", "executor": f"sloserve-service:{v}",
            "gpu_executor": f"sloserve-vllm-cuda:{v}", "redis": "redis:7.2.5-alpine"}


@dataclass(frozen=True, slots=True)
class Description:
    """A Deployment and what an orchestrator adds to it."""

    deployment: Deployment
    frontends: int = 1
    max_frontends: int = 4
    backend: str = "sim"
    images: dict[str, str] = field(default_factory=default_images)

    @property
    def split(self) -> bool:
        """Kubernetes: a router and a frontend Deployment (its HPA may run more than one
        replica: a gateway per replica would be a Controller per replica), else the one
        gateway (``frontends`` = ``max_frontends`` = 1)."""
        return self.max_frontends > 1

    def pairs(self) -> list[tuple[int, str, str]]:
        """``[(k, instance_id, role)]``: one scheduler + executor pair per instance."""
        d = self.deployment
        return [(k, iid, role) for k, (iid, role) in
                enumerate(instance_roles(d.policy, d.instances, d.hp_instances))]


def _int(raw: dict[str, Any], key: str, default: int, low: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}: must be an integer >= {low}, got {value!r}")
    return value


def load_description(text: str) -> Description:
    """Parse and check a description; a bad or unknown key raises ``ValueError`` naming it."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"description: not YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"description: must be a mapping, got {type(raw).__name__}")
    frontends = _int(raw, "frontends", 1, 1)
    max_frontends = _int(raw, "max_frontends", max(4, frontends), frontends)
    backend = raw.get("backend", "sim")
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    images = default_images()
    given = raw.get("images", {})
    if not isinstance(given, dict):
        raise ValueError(f"images: must be a mapping of {', '.join(IMAGE_KEYS)}")
    for key, image in given.items():
        if key not in IMAGE_KEYS:
            raise ValueError(f"images.{key}: unknown image (images: {', '.join(IMAGE_KEYS)})")
        name, _, tag = str(image).partition(":")
        if not isinstance(image, str) or not name or not tag or tag == "latest":
            raise ValueError(f"images.{key}: must be NAME:TAG with a pinned tag, got {image!r}")
        images[key] = image
    if "executor" not in given:  # torch: infra/Dockerfile.torch's image (model inside)
        images["executor"] = (f"sloserve-torch:{_version()}" if backend == "torch"
                              else images["service"])
    rest = {k: v for k, v in raw.items() if k not in EXTRA_KEYS}
    try:
        dep = Deployment.from_json(json.dumps(rest))
    except ValueError as exc:
        if "unknown field" in str(exc):
            unknown = sorted(set(rest) - set(json.loads(Deployment().to_json())))[0]
            raise ValueError(f"{unknown}: unknown key (a Deployment field or one of "
                             f"{', '.join(EXTRA_KEYS)})") from None
        raise
    return Description(dep, frontends, max_frontends, backend, images)


def _deployment_json(desc: Description, slo_env: bool) -> str:
    """The Deployment as services get it; ``slo_env``: compose's ``${SLOSERVE_TTFT_SLO}``
    and ``${SLOSERVE_TBT_SLO}`` override the SLOs at ``up`` time."""
    text = desc.deployment.to_json()
    if not slo_env:
        return text
    d = json.loads(text)
    for key, env in (("ttft_slo", "SLOSERVE_TTFT_SLO"), ("tbt_slo", "SLOSERVE_TBT_SLO")):
        if d[key] is not None:
            d[key] = f"@@{env}:{d[key]}@@"
    out = json.dumps(d, sort_keys=True)
    for key, env in (("ttft_slo", "SLOSERVE_TTFT_SLO"), ("tbt_slo", "SLOSERVE_TBT_SLO")):
        if d[key] is not None:
            value = d[key].split(":", 1)[1].rstrip("@")
            out = out.replace(f'"@@{env}:{value}@@"', f"${{{env}:-{value}}}")
    return out


def _executor_args(desc: Description, k: int, host: str | None, backend: str) -> list[str]:
    d = desc.deployment
    args = ["sloserve.services.executor", *(["--host", host] if host else []),
            "--port", str(EXECUTOR_PORT), "--backend", backend,
            "--seed", str(d.seed), "--instance", str(k)]
    return args


def _wait(backend: str) -> list[str]:
    """``--connect-timeout`` for a scheduler or gateway whose executors load a model."""
    start = START_S[backend]
    return ["--connect-timeout", str(start)] if start > START_S["sim"] else []


def _scheduler_args(desc: Description, iid: str, role: str, executor: str,
                    backend: str, advertise: str) -> list[str]:
    """A scheduler's command; ``advertise``: the name the gateway dials it by, which it
    registers in Redis (the gateway follows the registry: issue 34, item 2)."""
    d = desc.deployment
    return ["sloserve.services.scheduler", "--host", "0.0.0.0", "--port", str(SCHEDULER_PORT),
            "--advertise", advertise, "--instance-id", iid, "--role", role,
            "--policy", d.policy, "--num-hp", str(d.hp_instances), *_wait(backend),
            "--executor", executor]


def _gateway_registry(desc: Description) -> list[str]:
    """The gateway learns the schedulers from the registry in Redis (no fixed list): it
    serves once every instance of the description has registered, and follows joins and
    leaves from there."""
    return ["--min-instances", str(len(desc.pairs()))]


# every block written out (no ``&id001`` anchors): the file reads as rendered
_Dumper = type("_Dumper", (yaml.SafeDumper,), {"ignore_aliases": lambda self, data: True})


def _dump(header: str, docs: list[dict[str, Any]]) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100)
                        for d in docs)
    return header + body


def _header(what: str, source: str, command: str) -> str:
    return (f"# GENERATED by `sloserve render {command}` from {source}: do not edit by hand.\n"
            f"# Regenerate: python -m sloserve.services.cli render {command} {source} "
            f"--out {what}\n"
            "# (tests/infra/test_render.py fails when this file and the render drift apart;\n"
            "#  docs/deploy.md describes the description file and what is rendered.)\n")


HEALTH = ("import sys; from sloserve.services.rpc import wait_healthy; "
          "wait_healthy(sys.argv[1], timeout=3)")


def render_compose(desc: Description, source: str = "DESCRIPTION",
                   out: str = "docker-compose.yml") -> str:
    """docker-compose YAML: Redis, the perf model, one executor + scheduler service per
    instance, and the gateway (published on the host's loopback only); ``frontends`` N > 1:
    the router and N frontends sharing the published ports (:func:`_compose_frontends`).
    Plaintext on an internal network."""
    dep = _deployment_json(desc, slo_env=True)
    env = {"REDIS_URL": "redis://:${SLOSERVE_REDIS_PASSWORD:?set SLOSERVE_REDIS_PASSWORD}"
                        f"@redis:{REDIS_PORT}/0",
           "SLOSERVE_INTERNAL_TOKEN": "${SLOSERVE_INTERNAL_TOKEN:?set SLOSERVE_INTERNAL_TOKEN}",
           DEPLOYMENT_ENV: dep}
    # a check starts Python and imports gRPC: on a busy host that alone can take over 5 s
    # (a 4-instance stack at load 60 had SERVING schedulers fail theirs); 30 s: Docker's own
    # default
    health = {"interval": "2s", "timeout": "30s", "retries": 30}
    build = {"context": ".", "dockerfile": "infra/Dockerfile.service"}

    def service(image: str, command: list[str], **extra: Any) -> dict[str, Any]:
        svc: dict[str, Any] = {"image": image}
        if image == desc.images["service"]:
            svc["build"] = build
        else:
            svc["entrypoint"] = ["python", "-m"]
        svc.update({"restart": "unless-stopped", "networks": ["backend"],
                    "environment": dict(env), "command": command})
        svc.update(extra)
        return svc

    start = START_S[desc.backend]

    def grpc_health(port: int) -> dict[str, Any]:
        check = {"test": ["CMD", "python", "-c", HEALTH, f"127.0.0.1:{port}"], **health}
        if start > START_S["sim"]:  # the model loads first
            check["start_period"] = f"{start:.0f}s"
        return check

    redis_ok = {"redis": {"condition": "service_healthy"}}
    services: dict[str, Any] = {
        "redis": {"image": desc.images["redis"], "networks": ["backend"],
                  "command": ["redis-server", "--requirepass",
                              "${SLOSERVE_REDIS_PASSWORD:?set SLOSERVE_REDIS_PASSWORD}"],
                  "environment": {"REDISCLI_AUTH": "${SLOSERVE_REDIS_PASSWORD}"},
                  "healthcheck": {"test": ["CMD", "redis-cli", "ping"], **health}},
        "perfmodel": service(desc.images["service"],
                             ["sloserve.services.perfmodel", "--host", "0.0.0.0", "--port",
                              str(PERFMODEL_PORT)], depends_on=redis_ok),
    }
    for k, iid, role in desc.pairs():
        services[f"executor-{iid}"] = service(
            desc.images["executor"], _executor_args(desc, k, "0.0.0.0", desc.backend),
            depends_on=redis_ok, healthcheck=grpc_health(EXECUTOR_PORT))
        services[f"scheduler-{iid}"] = service(
            desc.images["service"],
            _scheduler_args(desc, iid, role, f"executor-{iid}:{EXECUTOR_PORT}", desc.backend,
                            f"scheduler-{iid}"),
            depends_on={f"executor-{iid}": {"condition": "service_healthy"}},
            healthcheck=grpc_health(SCHEDULER_PORT))
    schedulers_ok = {f"scheduler-{iid}": {"condition": "service_healthy"}
                     for _, iid, _ in desc.pairs()}
    published = {"networks": ["backend", "front"],
                 "ports": [f"127.0.0.1:${{SLOSERVE_GATEWAY_PORT:-{GATEWAY_PORT}}}:{GATEWAY_PORT}",
                           f"127.0.0.1:${{SLOSERVE_HTTP_PORT:-{HTTP_PORT}}}:{HTTP_PORT}"]}
    public_env = {"SLOSERVE_INTERNAL_TOKEN": env["SLOSERVE_INTERNAL_TOKEN"],
                  "SLOSERVE_API_KEYS": "${SLOSERVE_API_KEYS:-}", DEPLOYMENT_ENV: dep}
    notes = _COMPOSE_NOTES
    if desc.frontends == 1:
        gateway = service(
            desc.images["service"],
            ["sloserve.services.gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT),
             "--http-port", str(HTTP_PORT), *_wait(desc.backend), *_gateway_registry(desc)],
            **published, depends_on={**redis_ok, **schedulers_ok})
        # REDIS_URL: the registry, which schedulers there are
        gateway["environment"] = {"REDIS_URL": env["REDIS_URL"], **public_env}
        services["gateway"] = gateway
    else:
        router = service(
            desc.images["service"],
            ["sloserve.services.router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT),
             *_wait(desc.backend), *_gateway_registry(desc)],
            depends_on={**redis_ok, **schedulers_ok}, healthcheck=grpc_health(ROUTER_PORT))
        services["router"] = router
        services.update(_compose_frontends(desc, service, published, public_env))
        notes += _COMPOSE_FRONTENDS_NOTES.format(n=desc.frontends, last=desc.frontends - 1,
                                                 port=ROUTER_PORT)
    compose = {"services": services,
               "networks": {"backend": {"internal": True}, "front": {}}}
    header = _header(out, source, "compose") + notes
    return _dump(header, [compose])


def _compose_frontends(desc: Description, service: Any, published: dict[str, Any],
                       public_env: dict[str, str]) -> dict[str, Any]:
    """``up --frontends N`` in compose: ``gateway`` (frontend 0) holds the published ports
    and the networks; ``gateway-1`` .. share its network namespace (``network_mode:
    service:gateway``), so all N listen on the same ports (SO_REUSEPORT, as under ``up``)
    and the kernel spreads connections over them. Each is given the router's address and
    no Redis (it reads no registry)."""
    out: dict[str, Any] = {}
    for k in range(desc.frontends):
        name = "gateway" if k == 0 else f"gateway-{k}"
        cmd = ["sloserve.services.frontend", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT),
               "--http-port", str(HTTP_PORT), *_wait(desc.backend),
               "--router", f"router:{ROUTER_PORT}", "--index", str(k)]
        after = {"router": {"condition": "service_healthy"}}
        if k:
            after["gateway"] = {"condition": "service_started"}
        svc = service(desc.images["service"], cmd, depends_on=after,
                      **(published if k == 0 else {"network_mode": "service:gateway"}))
        if k:
            del svc["networks"]  # compose: network_mode excludes networks
        svc["environment"] = dict(public_env)
        out[name] = svc
    return out


_COMPOSE_NOTES = """\
#   export SLOSERVE_REDIS_PASSWORD=$(openssl rand -hex 24)
#   export SLOSERVE_INTERNAL_TOKEN=$(openssl rand -hex 32)
#   export SLOSERVE_API_KEYS=my-key          # empty: auth off (the gateway logs auth_off)
#   docker compose up --build   # gateway on 127.0.0.1:${SLOSERVE_GATEWAY_PORT:-50051},
#                               # OpenAI API on 127.0.0.1:${SLOSERVE_HTTP_PORT:-8000}
# infra/compose_smoke.sh does this with fresh secrets and benches 100 requests.
# Access (docs/reliability.md): only the gateway's ports are published (host loopback);
# everything else is on the internal `backend` network. Redis requires a password,
# internal services the internal token, the gateway an API key when SLOSERVE_API_KEYS
# is set. Every service is handed the Deployment in $SLOSERVE_DEPLOYMENT;
# SLOSERVE_TTFT_SLO / SLOSERVE_TBT_SLO override its SLOs.
"""


def _k8s_probe(port: int, public: bool) -> dict[str, Any]:
    """An exec probe with the container's credentials (the kubelet's gRPC probe speaks no
    TLS): the gateway's public CA, else the internal mutual-TLS files."""
    creds = (f"from sloserve.services.tls import client_credentials as c; "
             f"cred = c('{PUBLIC_DIR}/ca.crt')" if public else
             "from sloserve.services.tls import MutualTLS; m = MutualTLS.from_env(); "
             "cred = m and m.channel_credentials()")
    script = (f"{creds}; from sloserve.services.rpc import wait_healthy; "
              f"wait_healthy('127.0.0.1:{port}', timeout=3, credentials=cred)")
    return {"exec": {"command": ["python", "-c", script]}, "timeoutSeconds": 5}


def _secret_env(name: str, key: str, secret: str = "sloserve") -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _config_env(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": "sloserve", "key": key}}}


def render_k8s(desc: Description, gpu_variant: bool = False, source: str = "DESCRIPTION",
               out: str = "infra/k8s") -> dict[str, str]:
    """Kubernetes manifests (``sloserve.yaml``) and their ``kustomization.yaml``: Redis,
    the perf model, one StatefulSet per role whose pods are scheduler + executor pairs
    (``instances`` pods in all), the gateway Deployment with a HorizontalPodAutoscaler,
    probes, resources, NetworkPolicies, and the TLS Secrets mounted (public on the
    gateway, internal mutual TLS on every service). ``gpu_variant``: executors on the
    vLLM CUDA image, ``--backend vllm``, one ``nvidia.com/gpu`` each."""
    if gpu_variant and desc.backend != GPU_BACKEND:
        raise ValueError(f"backend: --gpu-variant runs vLLM executors; the description "
                         f"says {desc.backend!r} (set backend: vllm)")
    images = desc.images
    backend = GPU_BACKEND if gpu_variant else desc.backend
    executor_image = images["gpu_executor"] if gpu_variant else images["executor"]
    sentinels = ",".join(f"redis-{k}.redis:{SENTINEL_PORT}" for k in range(REDIS_REPLICAS))
    redis_url = f"redis+sentinel://:$(REDIS_PASSWORD)@{sentinels}/{REDIS_MASTER}/0"
    internal_env = [
        {"name": "SLOSERVE_INTERNAL_CA", "value": f"{INTERNAL_DIR}/ca.crt"},
        {"name": "SLOSERVE_INTERNAL_CERT", "value": f"{INTERNAL_DIR}/tls.crt"},
        {"name": "SLOSERVE_INTERNAL_KEY", "value": f"{INTERNAL_DIR}/tls.key"},
        _secret_env("SLOSERVE_INTERNAL_TOKEN", "internal-token"),
        _config_env(DEPLOYMENT_ENV, "deployment")]
    redis_env = [_secret_env("REDIS_PASSWORD", "redis-password"),
                 {"name": "REDIS_URL", "value": redis_url}]
    internal_mount = {"name": "internal-tls", "mountPath": INTERNAL_DIR, "readOnly": True}
    internal_volume = {"name": "internal-tls", "secret": {"secretName": "sloserve-internal-tls"}}

    def container(name: str, image: str, args: list[str], env: list[dict[str, Any]],
                  port: int | None, probe: dict[str, Any], requests: dict[str, str],
                  limits: dict[str, str], mounts: list[dict[str, Any]]) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name, "image": image}
        if image != images["service"] and image != images["redis"]:
            c["command"] = ["python", "-m"]
        c.update({"args": args, "env": env})
        if port is not None:
            c["ports"] = [{"containerPort": port}]
        if name not in ("redis", "sentinel"):  # the backend's start budget before liveness
            c["startupProbe"] = {**probe, "periodSeconds": 10,
                                 "failureThreshold": int(START_S[backend] // 10)}
        c["readinessProbe"] = {**probe, "periodSeconds": 5}
        c["livenessProbe"] = {**probe, "initialDelaySeconds": 20, "periodSeconds": 10,
                              "failureThreshold": 6}
        c["resources"] = {"requests": requests, "limits": limits}
        if mounts:
            c["volumeMounts"] = mounts
        return c

    def workload(kind: str, name: str, labels: dict[str, str], containers: list[Any],
                 volumes: list[Any], **spec: Any) -> dict[str, Any]:
        pod: dict[str, Any] = {"containers": containers}
        if volumes:
            pod["volumes"] = volumes
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
                "spec": {**spec, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": pod}}}

    docs: list[dict[str, Any]] = [
        *_redis_sentinel(images["redis"], container, workload),
        workload("Deployment", "perfmodel", {"app": "perfmodel"}, [container(
            "perfmodel", images["service"],
            ["sloserve.services.perfmodel", "--host", "0.0.0.0", "--port", str(PERFMODEL_PORT)],
            [*redis_env, *internal_env], PERFMODEL_PORT, _k8s_probe(PERFMODEL_PORT, False),
            {"cpu": "100m", "memory": "256Mi"}, {"cpu": "1", "memory": "1Gi"},
            [internal_mount])], [internal_volume]),
    ]
    gpu = {"nvidia.com/gpu": "1"} if gpu_variant else {}
    start = 0
    for role in ("lp", "hp"):
        ids = [iid for _, iid, r in desc.pairs() if r == role]
        if not ids:
            continue
        name = f"instance-{role}"
        executor = container(
            "executor", executor_image,
            [*_executor_args(desc, 0, None, backend)[:-1], "$(POD_INDEX)"],
            [{"name": "POD_INDEX", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
             *redis_env, *internal_env], None, _k8s_probe(EXECUTOR_PORT, False),
            {"cpu": "250m", "memory": "512Mi", **gpu}, {"cpu": "1", "memory": "2Gi", **gpu},
            [internal_mount])
        scheduler = container(
            "scheduler", images["service"],
            _scheduler_args(desc, "$(POD_NAME)", role, f"127.0.0.1:{EXECUTOR_PORT}", backend,
                            "$(POD_NAME).instance"),
            [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
             *redis_env, *internal_env], SCHEDULER_PORT, _k8s_probe(SCHEDULER_PORT, False),
            {"cpu": "250m", "memory": "512Mi"}, {"cpu": "1", "memory": "1Gi"},
            [internal_mount])
        # ordinals continue across roles: pod k's executor draws noise stream k, as `up`
        docs.append(workload("StatefulSet", name, {"app": "instance", "role": role},
                             [executor, scheduler], [internal_volume], serviceName="instance",
                             replicas=len(ids), ordinals={"start": start}))
        start += len(ids)
    docs += [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "instance"},
         "spec": {"clusterIP": "None", "selector": {"app": "instance"},
                  "ports": [{"port": SCHEDULER_PORT}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sloserve"},
         "data": {"deployment": _deployment_json(desc, slo_env=False)}},
    ]
    public = [internal_mount, {"name": "public-tls", "mountPath": PUBLIC_DIR, "readOnly": True}]
    public_volumes = [internal_volume, {"name": "public-tls",
                                        "secret": {"secretName": "sloserve-public-tls"}}]
    public_env = [*[e for e in internal_env if e["name"] != DEPLOYMENT_ENV],
                  _secret_env("SLOSERVE_API_KEYS", "api-keys"),
                  _config_env(DEPLOYMENT_ENV, "deployment")]
    public_args = ["--host", "0.0.0.0", "--port", str(GATEWAY_PORT), "--http-port",
                   str(HTTP_PORT), "--tls-cert", f"{PUBLIC_DIR}/tls.crt",
                   "--tls-key", f"{PUBLIC_DIR}/tls.key", *_wait(backend)]

    def front(name: str, args: list[str], env: list[dict[str, Any]],
              **spec: Any) -> dict[str, Any]:
        """The public Deployment (the gateway, or the frontends), its pods on the public
        TLS certificate and the gRPC + OpenAI ports."""
        c = container(name, images["service"], args, env, None, _k8s_probe(GATEWAY_PORT, True),
                      {"cpu": "250m", "memory": "512Mi"}, {"cpu": "2", "memory": "1Gi"},
                      public)
        c["ports"] = [{"name": "grpc", "containerPort": GATEWAY_PORT},
                      {"name": "http", "containerPort": HTTP_PORT}]
        return workload("Deployment", name, {"app": name}, [c], public_volumes, **spec)

    if desc.split:
        router = container(
            "router", images["service"],
            ["sloserve.services.router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT),
             *_wait(backend), *_gateway_registry(desc)],
            [*redis_env, *internal_env], ROUTER_PORT, _k8s_probe(ROUTER_PORT, False),
            {"cpu": "250m", "memory": "512Mi"}, {"cpu": "2", "memory": "1Gi"}, [internal_mount])
        # one replica, and never two at once (Recreate, not a rolling update): the router
        # is the one Controller (one ticket per HP instance, one round-robin)
        docs += [workload("Deployment", "router", {"app": "router"}, [router],
                          [internal_volume], replicas=1, strategy={"type": "Recreate"}),
                 {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "router"},
                  "spec": {"selector": {"app": "router"}, "ports": [{"port": ROUTER_PORT}]}},
                 front("frontend", ["sloserve.services.frontend", *public_args,
                                    "--router", f"router:{ROUTER_PORT}"], public_env,
                       replicas=desc.frontends)]
    else:
        docs.append(front("gateway", ["sloserve.services.gateway", *public_args,
                                      *_gateway_registry(desc)],
                          [*public_env[:-2], *redis_env, *public_env[-2:]],
                          replicas=desc.frontends))
    app = "frontend" if desc.split else "gateway"
    docs += [
        # the public name stays `gateway` whichever pods answer behind it
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gateway"},
         "spec": {"selector": {"app": app},
                  "ports": [{"name": "grpc", "port": GATEWAY_PORT},
                            {"name": "http", "port": HTTP_PORT}]}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
         "metadata": {"name": app},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": app},
                  "minReplicas": desc.frontends, "maxReplicas": desc.max_frontends,
                  "metrics": [{"type": "Resource", "resource": {
                      "name": "cpu", "target": {"type": "Utilization",
                                                "averageUtilization": 70}}}]}},
        *_network_policies(desc.split),
    ]
    header = _header(out, source, "k8s --gpu-variant" if gpu_variant else "k8s") + (
        _K8S_FRONTENDS_NOTES if desc.split else _K8S_NOTES)
    used = sorted({c["image"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                   for c in d["spec"]["template"]["spec"]["containers"]})
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["sloserve.yaml"],
        "images": [{"name": i.partition(":")[0], "newName": i.partition(":")[0],
                    "newTag": i.partition(":")[2]} for i in used]}
    k_header = (_header(out, source,
                        "k8s --gpu-variant" if gpu_variant else "k8s")
                + "# Point an image at your registry, then apply:\n"
                  "#   kustomize edit set image sloserve-service=$REGISTRY/sloserve-service:TAG\n"
                  "#   kubectl apply -k .\n")
    return {"sloserve.yaml": _dump(header, docs),
            "kustomization.yaml": _dump(k_header, [kustomization])}


# a redis pod's config, written before it starts: the master the other pods' sentinels
# name (pod 0 when none answers: a new deployment), this pod a replica unless it is it
_REDIS_INIT = f"""\
set -eu
me="$HOSTNAME.redis"
master=""
for k in $(seq 0 {REDIS_REPLICAS - 1}); do
  if [ "redis-$k.redis" != "$me" ]; then
    master=$(redis-cli -h "redis-$k.redis" -p {SENTINEL_PORT} sentinel \\
      get-master-addr-by-name {REDIS_MASTER} 2>/dev/null | head -n 1) || master=""
  fi
  if [ -n "$master" ]; then break; fi
done
if [ -z "$master" ]; then master="redis-0.redis"; fi
{{ echo "requirepass $REDIS_PASSWORD"; echo "masterauth $REDIS_PASSWORD"
  echo "replica-announce-ip $me"
  if [ "$master" != "$me" ]; then echo "replicaof $master {REDIS_PORT}"; fi; }} \\
  > /conf/redis.conf
{{ echo "port {SENTINEL_PORT}"; echo "sentinel resolve-hostnames yes"
  echo "sentinel announce-hostnames yes"; echo "sentinel announce-ip $me"
  echo "sentinel monitor {REDIS_MASTER} $master {REDIS_PORT} {SENTINEL_QUORUM}"
  echo "sentinel auth-pass {REDIS_MASTER} $REDIS_PASSWORD"
  echo "sentinel down-after-milliseconds {REDIS_MASTER} 5000"
  echo "sentinel failover-timeout {REDIS_MASTER} 60000"; }} > /conf/sentinel.conf
"""


def _redis_sentinel(image: str, container: Any, workload: Any) -> list[dict[str, Any]]:
    """Redis with Sentinel: the StatefulSet (an init container writes each pod's config
    into an emptyDir; no persistence, as ``up``'s Redis) and its headless Service, which
    publishes pods before they are ready so the sentinels find each other."""
    password = [_secret_env("REDIS_PASSWORD", "redis-password")]
    conf = [{"name": "conf", "mountPath": "/conf"}]
    small = ({"cpu": "100m", "memory": "128Mi"}, {"cpu": "1", "memory": "512Mi"})
    redis = container("redis", image, ["redis-server", "/conf/redis.conf"],
                      [*password, _secret_env("REDISCLI_AUTH", "redis-password")], REDIS_PORT,
                      {"exec": {"command": ["redis-cli", "ping"]}}, *small, conf)
    sentinel = container("sentinel", image, ["redis-server", "/conf/sentinel.conf",
                                             "--sentinel"], [], SENTINEL_PORT,
                         {"exec": {"command": ["redis-cli", "-p", str(SENTINEL_PORT),
                                               "ping"]}},
                         {"cpu": "50m", "memory": "64Mi"}, {"cpu": "500m", "memory": "256Mi"},
                         conf)
    sts = workload("StatefulSet", "redis", {"app": "redis"}, [redis, sentinel],
                   [{"name": "conf", "emptyDir": {}}], serviceName="redis",
                   replicas=REDIS_REPLICAS)
    sts["spec"]["template"]["spec"]["initContainers"] = [{
        "name": "config", "image": image, "command": ["sh", "-c", _REDIS_INIT],
        "env": password, "volumeMounts": conf,
        "resources": {"requests": small[0], "limits": small[1]}}]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "redis"},
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {"app": "redis"},
                        "ports": [{"name": "redis", "port": REDIS_PORT},
                                  {"name": "sentinel", "port": SENTINEL_PORT}]}}
    return [sts, service]


def _network_policies(split: bool) -> list[dict[str, Any]]:
    """Deny all ingress but what the services dial. ``split``: clients -> frontends,
    frontends -> router, router and frontends -> schedulers (a scheduler streams tokens
    straight to the frontend that owns the request, on the frontend's own stream), router
    -> Redis (frontends read none); else clients -> gateway -> schedulers, gateway -> Redis."""
    def policy(name: str, app: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name},
                "spec": {"podSelector": {"matchLabels": {"app": app}},
                         "policyTypes": ["Ingress"], "ingress": ingress}}

    def pods(*apps: str) -> list[dict[str, Any]]:
        return [{"podSelector": {"matchLabels": {"app": a}}} for a in apps]

    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "default-deny-ingress"},
         "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
        *([policy("frontend-from-clients", "frontend",
                  [{"ports": [{"port": GATEWAY_PORT}, {"port": HTTP_PORT}]}]),
           policy("router-from-frontends", "router",
                  [{"from": pods("frontend"), "ports": [{"port": ROUTER_PORT}]}]),
           policy("scheduler-from-router-and-frontends", "instance",
                  [{"from": pods("router", "frontend"), "ports": [{"port": SCHEDULER_PORT}]}])]
          if split else
          [policy("gateway-from-clients", "gateway",
                  [{"ports": [{"port": GATEWAY_PORT}, {"port": HTTP_PORT}]}]),
           policy("scheduler-from-gateway", "instance",
                  [{"from": pods("gateway"), "ports": [{"port": SCHEDULER_PORT}]}])]),
        policy("redis-from-services", "redis",  # and from its own pods: replication
               [{"from": pods("instance", "perfmodel", "router" if split else "gateway",
                              "redis"),
                 "ports": [{"port": REDIS_PORT}, {"port": SENTINEL_PORT}]}]),
    ]


_COMPOSE_FRONTENDS_NOTES = """\
# Frontends (issue 33; `up --frontends {n}`): the router holds the one Controller and follows
# the registry in Redis; gateway .. gateway-{last} are {n} stateless frontends in one network
# namespace (gateway-k: network_mode service:gateway) sharing the published ports, each
# given the router's address (router:{port}) and no Redis. Tokens go from a scheduler
# straight to the frontend that owns the request. Recreating `gateway` recreates the
# namespace: restart gateway-1.. after it (docker compose up -d recreates dependants).
"""


_K8S_HEAD = """\
# Build and push the images, point kustomization.yaml at your registry, create the
# secrets (never commit them), then `kubectl apply -k` this directory:
#   kubectl create secret generic sloserve \\
#     --from-literal=redis-password=$(openssl rand -hex 24) \\
#     --from-literal=internal-token=$(openssl rand -hex 32) \\
#     --from-literal=api-keys=my-key        # "" : gateway auth off (it logs auth_off)
#   kubectl create secret generic sloserve-public-tls --from-file=tls.crt \\
#     --from-file=tls.key --from-file=ca.crt   # the gateway's gRPC + HTTPS certificate
#   kubectl create secret generic sloserve-internal-tls --from-file=tls.crt \\
#     --from-file=tls.key --from-file=ca.crt   # mutual TLS inside ($SLOSERVE_INTERNAL_*)
"""

_K8S_NOTES = _K8S_HEAD + """\
# Certificates: the public one names the gateway's external name and 127.0.0.1 (the
# probes); the internal one names *.instance, perfmodel, redis and 127.0.0.1.
# Redis: 3 pods of redis-server + sentinel (quorum 2, master name "sloserve"); services
# use redis+sentinel://, so a dead master's replica is promoted and they follow it.
# Probes run the gRPC health check inside the container with its credentials (the
# kubelet's gRPC probe speaks no TLS). NetworkPolicies deny all ingress but clients ->
# gateway, gateway -> schedulers, instances, perf model and gateway -> Redis (a CNI
# that enforces them: Calico, Cilium, ...). Scaling instances: each scheduler registers
# in Redis under its pod's name ($(POD_NAME).instance) and the gateway follows the
# registry: a pod that comes or goes (rescheduled, a StatefulSet scaled) joins or leaves
# the gateway's instances (--min-instances is only how many it waits for at start).
"""

_K8S_FRONTENDS_NOTES = _K8S_HEAD + f"""\
# Certificates: the public one names the gateway's external name and 127.0.0.1 (the
# probes); the internal one names *.instance, router, perfmodel, redis and 127.0.0.1.
# Redis: 3 pods of redis-server + sentinel (quorum 2, master name "sloserve"); services
# use redis+sentinel://, so a dead master's replica is promoted and they follow it.
# Probes run the gRPC health check inside the container with its credentials (the
# kubelet's gRPC probe speaks no TLS).
# The front door is `up --frontends N`'s (issue 33): the `router` Deployment (1 replica,
# Recreate: never two) holds the one Controller and follows the registry in Redis; the
# `frontend` Deployment (stateless; its HPA scales it) answers behind the public Service
# `gateway` and is given the router's address (router:{ROUTER_PORT}), not Redis. Each
# scheduler registers in Redis under its pod's name ($(POD_NAME).instance): the router
# tells the frontends of each join and leave (--min-instances is only how many it waits
# for at start). NetworkPolicies deny all ingress but clients -> frontends, frontends ->
# router, router and frontends -> schedulers (tokens go from a scheduler straight to the
# frontend that owns the request), instances, perf model and router -> Redis (a CNI that
# enforces them: Calico, Cilium, ...).
"""
