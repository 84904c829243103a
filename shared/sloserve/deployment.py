"""One ``Deployment``: what runs, on what, under which SLOs (issue 32, item 2).

The simulator (``SimConfig`` = Deployment + workload) and the live stack
(``StackConfig`` = Deployment + processes) share this one declaration: every
default is here once, each field carries its ``--flag`` help (``setting``, as
the policies' ``knob``), and every service receives the resolved Deployment as
JSON (``$SLOSERVE_DEPLOYMENT`` or ``--deployment``), so the TBT SLO and every
default reach a scheduler however it was started (``up``, compose, Kubernetes).

Defaults where the simulator and ``up`` used to disagree (issue 32):

* ``prefix_caching``: on, as vLLM V1 (issue 33, item 4); it only acts on requests
  that carry a prefix identity.
* ``admission``: ``None`` (queue everything), as stock vLLM, which neither bounds
  its queue nor sheds; every simulated figure was made so. Bounded queues and
  shedding are one flag away (``--admission`` or any limit flag) in both.
* ``refit_interval``: ``None``, a refit every ``REFIT_EVERY`` batches, the clock
  every simulated figure was made with; the perf-model service counts batches
  the same way, and ``--refit-interval S`` refits every S seconds in both.
* ``overlap``: ``None``, each runner's own: the live scheduler overlaps (SGLang's
  default), the simulator does not model it unless asked (``--overlap``).
"""

from __future__ import annotations

import json
import math
import os
import typing
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any

from sloserve.admission import Admission
from sloserve.defaults import GPU, MODEL, NOISE_CV, TBT_SLO, TTFT_SLO
from sloserve.policies.base import PolicyConfig
from sloserve.policies.registry import check_deployment, get_spec, policy_names

REFIT_EVERY = 512  # batches between online refits when no interval is given
DEPLOYMENT_ENV = "SLOSERVE_DEPLOYMENT"  # every service's Deployment, as JSON


def setting(default: Any, help: str, *, flag: bool = True, min: float | None = None,
            above: float | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A Deployment field: its default, its ``--flag`` help, and the rule it is checked by
    (``min``: >=, ``above``: >; ``flag=False``: set through its own flags, e.g. the policy
    knobs or admission's)."""
    meta: dict[str, Any] = {"help": help, "flag": flag}
    if min is not None:
        meta["min"] = min
    if above is not None:
        meta["above"] = above
    if choices:
        meta["choices"] = choices
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class Deployment:
    """Policy and its config, instances and roles, model, GPU, KV, prefix caching and
    routing, admission, overlap, refit clock, SLOs and noise."""

    policy: str = setting("sarathi", "the scheduling policy every instance runs")
    policy_config: PolicyConfig | None = setting(
        None, "the policy's knobs (None: its defaults)", flag=False)
    instances: int = setting(1, "instances (each one scheduler + executor)", min=1)
    hp_instances: int = setting(
        0, "Ascendra HP instances among --instances (2L1H: 3 and 1)", min=0)
    model: str = setting(MODEL, "model name")
    gpu: str = setting(GPU, "GPU (sim: profiled GPU; torch/vllm: cpu or a CUDA GPU)")
    tp: int = setting(1, "tensor-parallel degree (simulator)", min=1)
    block_size: int = setting(16, "KV block size, tokens", min=1, flag=False)
    num_blocks: int | None = setting(None, "KV blocks per instance (default: from the GPU's "
                                           "memory)", min=1)
    prefix_caching: bool = setting(
        True, "automatic prefix caching (vLLM V1's default; only requests with a prefix "
              "identity share blocks)")
    prefix_routing: bool = setting(
        False, "route new requests to the instance caching their prefix, within a load "
               "bound (SGLang's cache-aware router), instead of round-robin")
    admission: Admission | None = setting(
        None, "bounded queues and TTFT shedding at arrival (None: queue everything, as vLLM)",
        flag=False)
    overlap: bool | None = setting(
        None, "overlap scheduling: plan k+1 decided while plan k runs (default: live on, "
              "SGLang's; simulator off)")
    refit_interval: float | None = setting(
        None, f"refit the online perf model every S seconds (default: every {REFIT_EVERY} "
              "batches, simulator and perf-model service alike)", above=0)
    perf_model: str = setting("online", "online: refit from measured batches; roofline: "
                                        "never refit (protocol tests)",
                              choices=("online", "roofline"))
    ttft_slo: float | None = setting(TTFT_SLO, "TTFT SLO, s (for requests without their "
                                               "own)", above=0)
    tbt_slo: float | None = setting(TBT_SLO, "TBT SLO, s (for requests without their own); "
                                             "picks the default token budget (Sarathi-Serve "
                                             "§5)", above=0)
    seed: int = setting(0, "seed (workload and ground-truth noise)")
    noise_cv: float = setting(NOISE_CV, "run-to-run noise of the batch times (CV)", min=0)

    def check(self) -> None:
        """Every field's rule; a bad value raises ``ValueError`` naming the field."""
        hints = typing.get_type_hints(Deployment)
        for f in fields(Deployment):
            _check_setting(f, getattr(self, f.name), hints[f.name])
        get_spec(self.policy)  # a registered policy or variant, else refused by name
        check_deployment(self.policy, self.instances, self.hp_instances, self.policy_config)

    def resolved_policy_config(self, slo_mix: str | None = None) -> PolicyConfig:
        """The policy's config with its SLO-dependent defaults (token budget, slack's
        ``tail_tbt``) filled in from this deployment's TBT SLO."""
        base = self.policy_config or get_spec(self.policy).config_cls()
        return base.resolved(tbt_slo=self.tbt_slo, slo_mix=slo_mix)

    def deployment(self) -> Deployment:
        """Only the Deployment's fields (a ``SimConfig``/``StackConfig`` less the rest)."""
        return Deployment(**{f.name: getattr(self, f.name) for f in fields(Deployment)})

    def to_json(self) -> str:
        """Every field, the policy config as its knobs and admission as its limits."""
        d = {f.name: getattr(self, f.name) for f in fields(Deployment)}
        d["policy_config"] = None if self.policy_config is None else asdict(self.policy_config)
        d["admission"] = None if self.admission is None else asdict(self.admission)
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Deployment:
        """The inverse of :meth:`to_json`; an unknown or bad field is a ``ValueError``
        naming it. Fields not given take their defaults."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"deployment: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"deployment: must be a JSON object, got {type(raw).__name__}")
        names = {f.name for f in fields(Deployment)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"deployment: unknown field {unknown[0]!r} "
                             f"(fields: {', '.join(sorted(names))})")
        policy = raw.get("policy", "sarathi")
        if policy not in policy_names():
            raise ValueError(f"policy: must be one of {', '.join(policy_names())}, "
                             f"got {policy!r}")
        pc = raw.get("policy_config")
        if pc is not None:
            if not isinstance(pc, dict):
                raise ValueError("policy_config: must be a JSON object of knobs")
            knobs = get_spec(policy).knobs()
            bad = sorted(set(pc) - set(knobs))
            if bad:
                raise ValueError(f"policy_config: {bad[0]!r} is not a knob of policy "
                                 f"{policy!r}")
            raw["policy_config"] = get_spec(policy).config_cls(**pc)
        adm = raw.get("admission")
        if adm is not None:
            if not isinstance(adm, dict):
                raise ValueError("admission: must be a JSON object of limits or null")
            try:
                raw["admission"] = Admission(**adm)
            except TypeError as exc:
                raise ValueError(f"admission: {exc}") from None
        d = Deployment(**raw)
        d.check()
        return d


def from_env(environ: typing.Mapping[str, str] | None = None) -> Deployment:
    """The Deployment a service was handed in ``$SLOSERVE_DEPLOYMENT`` (defaults if unset)."""
    text = (os.environ if environ is None else environ).get(DEPLOYMENT_ENV, "")
    if not text.strip():
        return Deployment()
    try:
        return Deployment.from_json(text)
    except ValueError as exc:
        raise ValueError(f"${DEPLOYMENT_ENV}: {exc}") from None


def _check_setting(f: Field[Any], value: Any, hint: Any) -> None:
    """One field's value against its type and its ``setting`` rule, refused by name."""
    if f.name in ("policy_config", "admission"):
        want = PolicyConfig if f.name == "policy_config" else Admission
        if value is not None and not isinstance(value, want):
            raise ValueError(f"{f.name}: must be a {want.__name__} or None, got {value!r}")
        return
    kinds = typing.get_args(hint) or (hint,)
    if value is None:
        if type(None) not in kinds:
            raise ValueError(f"{f.name}: must be set, got None")
        return
    _check_kind(f.name, value, kinds)
    _check_bounds(f.name, value, f.metadata)


def _of_kind(value: Any, kinds: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of ``kinds`` (a bool is not an int, an int is a float)."""
    if isinstance(value, bool):
        return bool in kinds
    return ((int in kinds and isinstance(value, int))
            or (float in kinds and isinstance(value, int | float))
            or (str in kinds and isinstance(value, str)))


def _check_kind(name: str, value: Any, kinds: tuple[Any, ...]) -> None:
    if not _of_kind(value, kinds):
        names = " or ".join(k.__name__ for k in kinds if k is not type(None))
        raise ValueError(f"{name}: must be {names}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value}")


def _check_bounds(name: str, value: Any, meta: Any) -> None:
    if "choices" in meta and value not in meta["choices"]:
        raise ValueError(f"{name}: must be one of {', '.join(meta['choices'])}; "
                         f"got {value!r}")
    if isinstance(value, bool):
        return
    if "min" in meta and value < meta["min"]:
        raise ValueError(f"{name}: must be >= {meta['min']}, got {value}")
    if "above" in meta and value <= meta["above"]:
        raise ValueError(f"{name}: must be > {meta['above']}, got {value}")
