"""Command-line flags generated from the ``Deployment`` (issue 32, item 2).

One declaration (``sloserve.deployment``), every parser: ``simulate``, ``capacity``,
``compare``, ``up`` and the services add ``--field-name`` for the fields they take
(type, choices, help and default from the field, as Vidur's ``flat_dataclass``
turns one config tree into flags); ``deployment_from_args`` lays the flags that were
set over a base Deployment, by default the one the service was handed
(``--deployment JSON`` or ``$SLOSERVE_DEPLOYMENT``). Unset flags stay ``None``, so a
flag only ever overrides.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Collection, Mapping
from dataclasses import Field, fields
from typing import Any

from sloserve.deployment import DEPLOYMENT_ENV, Deployment, from_env
from sloserve.policies import policy_names
from sloserve.services.argtypes import number

SLOS = ("ttft_slo", "tbt_slo")


def flag(name: str) -> str:
    """``tbt_slo`` -> ``--tbt-slo``."""
    return "--" + name.replace("_", "-")


def _kind(hint: Any) -> type:
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
    kind: type = kinds[0]
    return kind


def _type(f: Field[Any], kind: type, zero_is_none: bool) -> Any:
    meta = f.metadata
    if kind is str:
        return None
    if f.name in SLOS and zero_is_none:
        return number(kind, 0, strict=False)  # 0: no default SLO (the gateway's rule)
    if "above" in meta:
        return number(kind, meta["above"], strict=True)
    if "min" in meta:
        return number(kind, meta["min"], strict=False)
    return number(kind, float("-inf"), strict=False)


def add_deployment_arg(p: argparse.ArgumentParser) -> None:
    """``--deployment JSON``: the whole resolved Deployment (``up`` hands every service one;
    default ``$SLOSERVE_DEPLOYMENT``, else the defaults). A flag set beside it wins."""
    p.add_argument("--deployment", default=None, metavar="JSON",
                   help=f"the resolved Deployment as JSON (default ${DEPLOYMENT_ENV}, else "
                        "every field's default); the deployment flags override it")


def add_flags(p: argparse.ArgumentParser, names: Collection[str] | None = None, *,
              defaults: Mapping[str, Any] | None = None, required: Collection[str] = (),
              aliases: Mapping[str, str] | None = None, zero_is_none: bool = False) -> None:
    """``--field`` for every flag field of the Deployment (or those in ``names``).

    ``defaults``: this command's own defaults (e.g. ``compare`` runs 3 instances);
    ``aliases``: an older flag name kept working; ``zero_is_none``: an SLO flag's 0
    means no default SLO (the live services' convention).
    """
    defaults = defaults or {}
    aliases = aliases or {}
    hints = typing.get_type_hints(Deployment)
    group = p.add_argument_group(
        "deployment", "what runs, on what, under which SLOs (sloserve.deployment; one "
        "default for simulate and up)")
    for f in fields(Deployment):
        if not f.metadata.get("flag") or (names is not None and f.name not in names):
            continue
        kind = _kind(hints[f.name])
        shown = defaults.get(f.name, f.default)
        text = f.metadata["help"]
        if f.name in SLOS and zero_is_none:
            text += "; 0: none"
        if shown is not None and f.name not in required:
            text += f" (default: {shown})"
        text = text.replace("%", "%%")
        opts = [flag(f.name), *([aliases[f.name]] if f.name in aliases else [])]
        kw: dict[str, Any] = {"dest": f.name, "default": defaults.get(f.name), "help": text}
        if kind is bool:
            group.add_argument(*opts, action=argparse.BooleanOptionalAction, **kw)
            continue
        if f.name in required:
            kw["required"] = True
        choices = policy_names() if f.name == "policy" else f.metadata.get("choices")
        parse = _type(f, kind, zero_is_none)
        group.add_argument(*opts, **({"type": parse} if parse else {}), choices=choices, **kw)


def base_deployment(args: argparse.Namespace) -> Deployment:
    """The Deployment this process was handed: ``--deployment``, else ``$SLOSERVE_DEPLOYMENT``,
    else every default."""
    text = getattr(args, "deployment", None)
    if text is None:
        return from_env()
    try:
        return Deployment.from_json(text)
    except ValueError as exc:
        raise ValueError(f"--deployment: {exc}") from None


def deployment_from_args(args: argparse.Namespace, base: Deployment | None = None,
                         **values: Any) -> Deployment:
    """``base`` (default: :func:`base_deployment`) with the flags set in ``args`` and
    ``values`` laid over it; a bad value is a ``ValueError`` naming its flag. A policy
    flag naming another policy than the base's drops the base's policy config."""
    base = base_deployment(args) if base is None else base
    got: dict[str, Any] = {}
    for f in fields(Deployment):
        value = getattr(args, f.name, None) if f.metadata.get("flag") else None
        if value is None:
            continue
        got[f.name] = value
    got.update({k: v for k, v in values.items() if v is not None})
    new = field_values(base, **got)
    for k in SLOS:
        if got.get(k) == 0:
            new[k] = None  # 0: no default SLO
    if new["policy"] != base.policy and "policy_config" not in values:
        new["policy_config"] = None  # the base's knobs are another policy's
    try:
        d = Deployment(**new)
        d.check()
    except ValueError as exc:
        msg = str(exc)
        name = msg.split(":", 1)[0]
        if name in {f.name for f in fields(Deployment)} and name != "policy_config":
            raise ValueError(flag(name) + msg[len(name):]) from None
        raise
    return d


def field_values(d: Deployment, **values: Any) -> dict[str, Any]:
    """``d``'s fields by name, ``values`` (``None`` included) over them: the keywords a
    ``SimConfig``/``StackConfig`` is built from."""
    return {**{f.name: getattr(d, f.name) for f in fields(Deployment)}, **values}


def resolve_into(args: argparse.Namespace, base: Deployment | None = None) -> Deployment:
    """A service's Deployment (:func:`deployment_from_args`), each of its flag fields in
    ``args`` replaced by the resolved value, so the service reads one answer."""
    dep = deployment_from_args(args, base)
    for f in fields(Deployment):
        if f.metadata.get("flag") and hasattr(args, f.name):
            setattr(args, f.name, getattr(dep, f.name))
    return dep
