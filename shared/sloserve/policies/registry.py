"""Policy registry: a user-facing name -> (config class, the policy class of each role).

The one list of policies (``policy_names``) and the one place that knows
which policy has which instance roles. Ascendra is one policy with two roles,
``lp`` and ``hp`` (§4); every other policy has only ``lp``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from sloserve.policies.accelgen import AccelGenConfig, AccelGenPolicy
from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.ascendra_hp import AscendraHPPolicy
from sloserve.policies.ascendra_lp import AscendraLPPolicy
from sloserve.policies.base import Policy, PolicyConfig
from sloserve.policies.oracle import OracleConfig, OraclePolicy
from sloserve.policies.orca import OrcaConfig, OrcaPolicy
from sloserve.policies.sarathi import SarathiConfig, SarathiPolicy
from sloserve.policies.slack import SlackConfig, SlackPolicy
from sloserve.policies.vllm import VllmConfig, VllmPolicy

BASELINE = "vllm"  # vLLM's scheduler: what every comparison is against (docs/design.md)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One registered policy: its config class and the policy class each role runs."""

    name: str
    config_cls: type[PolicyConfig]
    roles: Mapping[str, type[Policy]]
    hp_share: int = 0  # default HP instances: instances // hp_share, at least 1 (0: none)
    sweep: tuple[str, ...] = ()  # knobs ``sloserve plan --mode accurate`` tries several values of
    # a baseline or reference the papers compare against, not a policy a user would pick:
    # what it is, in a few words (``compare`` shows it only with ``--baselines``; issue 32)
    baseline: str = ""

    def has_role(self, role: str) -> bool:
        return role in self.roles

    def knobs(self) -> list[str]:
        """The config's field names, in declaration order."""
        return [f.name for f in fields(self.config_cls)]

    def make(self, role: str, config: PolicyConfig | None = None, *, num_hp: int = 0) -> Policy:
        """The policy one ``role`` instance runs, in a deployment with ``num_hp`` HP instances.

        ``config`` is resolved first (an unset token budget takes the default TBT
        SLO's), then the role's rules apply (``PolicyConfig.for_role``).
        """
        if role not in self.roles:
            raise ValueError(f"role: policy {self.name!r} has no {role!r} role; "
                             f"it has {sorted(self.roles)}")
        cfg = self.config_cls() if config is None else config
        if not isinstance(cfg, self.config_cls):
            raise ValueError(f"config: policy {self.name!r} takes a {self.config_cls.__name__}, "
                             f"got a {type(cfg).__name__}")
        return self.roles[role](cfg.resolved().for_role(role, num_hp=num_hp))

    def default_hp(self, instances: int) -> int:
        """HP instances when the user names none (``compare``): a third, at least one."""
        if not self.has_role("hp") or self.hp_share == 0 or instances < 2:
            return 0
        return max(1, instances // self.hp_share)


_SPECS: dict[str, PolicySpec] = {
    s.name: s
    for s in (
        PolicySpec("vllm", VllmConfig, MappingProxyType({"lp": VllmPolicy})),
        PolicySpec("sarathi", SarathiConfig, MappingProxyType({"lp": SarathiPolicy}),
                   sweep=("token_budget",)),
        PolicySpec("ascendra", AscendraConfig,
                   MappingProxyType({"lp": AscendraLPPolicy, "hp": AscendraHPPolicy}), hp_share=3),
        PolicySpec("accelgen", AccelGenConfig, MappingProxyType({"lp": AccelGenPolicy})),
        PolicySpec("orca", OrcaConfig, MappingProxyType({"lp": OrcaPolicy}),
                   baseline="baseline: Orca, whole prompts, 8 per batch; AccelGen §6.1"),
        PolicySpec("oracle", OracleConfig, MappingProxyType({"lp": OraclePolicy}),
                   baseline="reference: SRPT on the true output lengths; AccelGen §6.1"),
        PolicySpec("slack", SlackConfig, MappingProxyType({"lp": SlackPolicy})),
    )
}


def policy_names() -> list[str]:
    """The policies a user can choose, in the order they are compared."""
    return list(_SPECS)


def compared_names(*, baselines: bool = False) -> list[str]:
    """The policies ``compare`` shows: those a user chooses between, plus the baselines and
    references (``PolicySpec.baseline``) when asked."""
    return [n for n, s in _SPECS.items() if baselines or not s.baseline]


def get_spec(name: str) -> PolicySpec:
    spec = _SPECS.get(name) or _VARIANTS.get(name)
    if spec is None:
        raise ValueError(f"policy: unknown {name!r}; choose one of {policy_names()}")
    return spec


_VARIANTS: dict[str, PolicySpec] = {}  # experiment-only variants: never in policy_names()


def register(spec: PolicySpec) -> None:
    """Add a policy variant for this process (experiments, e.g. §8.6's drop-late baselines).
    Variants resolve by name but stay out of ``policy_names()`` (CLI choices, ``compare``)."""
    if spec.name in _SPECS or spec.name in _VARIANTS:
        raise ValueError(f"policy: {spec.name!r} is already registered")
    _VARIANTS[spec.name] = spec


def instance_roles(policy: str, instances: int, hp_instances: int) -> list[tuple[str, str]]:
    """``[(instance_id, role), ...]``: LP instances first, then HP; ids ``f"{role}{i}"``
    with ``i`` the overall index (``lp0, lp1, hp2``), as the simulator and the stack name them.
    """
    spec = get_spec(policy)
    if instances < 1:
        raise ValueError(f"instances: must be >= 1, got {instances}")
    if not 0 <= hp_instances < instances:
        raise ValueError(f"hp_instances: must be in [0, instances), got {hp_instances} "
                         f"with {instances} instances")
    if hp_instances and not spec.has_role("hp"):
        raise ValueError(f"hp_instances: policy {policy!r} has no HP instances "
                         f"(only {[n for n in _SPECS if _SPECS[n].has_role('hp')]} do)")
    roles = ["lp"] * (instances - hp_instances) + ["hp"] * hp_instances
    return [(f"{role}{i}", role) for i, role in enumerate(roles)]


def check_deployment(
    policy: str, instances: int, hp_instances: int, config: PolicyConfig | None,
) -> None:
    """A deployment as the simulator and the stack take it: instances, roles, config class."""
    instance_roles(policy, instances, hp_instances)
    cls = get_spec(policy).config_cls
    if config is not None and not isinstance(config, cls):
        raise ValueError(f"policy_config: policy {policy!r} takes a {cls.__name__}, "
                         f"got a {type(config).__name__}")
