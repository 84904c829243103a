"""Scheduling policies, chosen by name (``vllm``, ``sarathi``, ``ascendra``, ``accelgen``,
``orca``, ``oracle``, ``slack``).

Each policy file declares its config (a ``PolicyConfig`` subclass) next to its
policy; ``registry`` maps a name to both and to its instance roles.
"""

from __future__ import annotations

from sloserve.policies.base import BatchBuilder, InstanceView, Policy, PolicyConfig
from sloserve.policies.registry import (
    BASELINE,
    PolicySpec,
    check_deployment,
    compared_names,
    get_spec,
    instance_roles,
    policy_names,
)

__all__ = [
    "BASELINE",
    "BatchBuilder",
    "InstanceView",
    "Policy",
    "PolicyConfig",
    "PolicySpec",
    "check_deployment",
    "compared_names",
    "get_spec",
    "instance_roles",
    "policy_names",
]
