"""Policy registry: policies are chosen by name (``vllm``, ``sarathi``, ...)."""

from __future__ import annotations

from collections.abc import Callable

from sloserve.policies.base import BatchBuilder, InstanceView, Policy, PolicyConfig

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    # Import for the side effect of @register; each file is one paper's policy.
    import importlib

    for mod in ("vllm", "sarathi", "ascendra", "accelgen"):
        try:
            importlib.import_module(f"sloserve.policies.{mod}")
        except ModuleNotFoundError as exc:  # a policy file not written yet
            if exc.name != f"sloserve.policies.{mod}":
                raise


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def make_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    _load_builtin()
    try:
        cls: Callable[[PolicyConfig | None], Policy] = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"policy: unknown {name!r}; choose one of {policy_names()}") from None
    return cls(config)


__all__ = [
    "BatchBuilder",
    "InstanceView",
    "Policy",
    "PolicyConfig",
    "make_policy",
    "policy_names",
    "register",
]
