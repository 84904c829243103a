"""Command-line flags generated from the policy configs: one declaration, every parser.

``add_policy_flags`` adds ``--field-name`` for every knob of every registered
policy (type, choices and help from the dataclass field); ``config_from_args``
builds the chosen policy's config from the flags that were set and rejects
any flag that is not one of its knobs; ``config_to_argv`` is the inverse, so
``sloserve up`` hands a scheduler service exactly the config ``simulate`` runs.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import Field, asdict, fields
from typing import Any

from sloserve.policies.base import PolicyConfig, knob_types
from sloserve.policies.registry import PolicySpec, get_spec, policy_names


def flag(name: str) -> str:
    """``token_budget`` -> ``--token-budget``."""
    return "--" + name.replace("_", "-")


def _specs() -> Iterator[PolicySpec]:
    return (get_spec(n) for n in policy_names())


def all_knobs() -> dict[str, list[tuple[PolicySpec, Field[Any]]]]:
    """Every knob name -> the policies that have it (with their field), in registry order."""
    out: dict[str, list[tuple[PolicySpec, Field[Any]]]] = {}
    for spec in _specs():
        for f in fields(spec.config_cls):
            out.setdefault(f.name, []).append((spec, f))
    return out


def _kind(hint: Any) -> type:
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if isinstance(
        hint, types.UnionType) else [hint]
    if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
        raise TypeError(f"policy knob type {hint!r} has no flag form")
    kind: type = kinds[0]
    return kind


def _parse(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _help(owners: Sequence[tuple[PolicySpec, Field[Any]]]) -> str:
    parts: dict[str, list[str]] = {}
    for spec, f in owners:
        text = f.metadata.get("help", "")
        if f.default is not None:
            text += f" (default {f.default})"
        parts.setdefault(text, []).append(spec.name)
    return "; ".join(f"{t} [{', '.join(names)}]" for t, names in parts.items()).replace("%", "%%")


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """``--knob`` for every knob of every registered policy, grouped under its policy in
    ``--help`` (a knob several policies share in one group of its own; issue 35, item 4);
    unset flags stay ``None``."""
    groups: dict[str, Any] = {}

    def group(owners: Sequence[tuple[PolicySpec, Field[Any]]]) -> Any:
        key = owners[0][0].name if len(owners) == 1 else ""
        if key not in groups:
            groups[key] = parser.add_argument_group(
                f"{key} policy knobs" if key else "policy knobs shared by several policies",
                f"--policy {key}; unset: its default" if key else
                "each belongs to the policies in brackets; unset: the policy's default")
        return groups[key]

    for name, owners in sorted(all_knobs().items(), key=lambda kv: len(kv[1]) == 1):
        spec, f = owners[0]
        kind = _kind(knob_types(spec.config_cls)[name])
        g = group(owners)
        if kind is bool:
            g.add_argument(flag(name), dest=name, default=None,
                           action=argparse.BooleanOptionalAction, help=_help(owners))
            continue
        choices = f.metadata.get("choices")
        g.add_argument(flag(name), dest=name, default=None, type=_parse(kind),
                       choices=choices, help=_help(owners))


def config_from_args(policy: str, args: argparse.Namespace, *,
                     strict: bool = True, base: PolicyConfig | None = None) -> PolicyConfig:
    """``policy``'s config from the knob flags set in ``args`` (over ``base``'s knobs, a
    handed Deployment's, where it is ``policy``'s config; else over the defaults).

    A flag set that is not a knob of ``policy`` is an error (``strict``) or
    left out (``compare``, where each knob goes to the policies that have it).
    """
    spec = get_spec(policy)
    own = spec.knobs()
    values: dict[str, Any] = asdict(base) if isinstance(base, spec.config_cls) else {}
    for name in all_knobs():
        value = getattr(args, name, None)
        if value is None:
            continue
        if name not in own:
            if not strict:
                continue
            raise ValueError(f"{flag(name)}: not a knob of policy {policy!r} "
                             f"(its knobs: {', '.join(flag(n) for n in own)})")
        values[name] = value
    try:
        return spec.config_cls(**values)
    except ValueError as exc:  # name the flag, not the field
        msg = str(exc)
        field_name = msg.split(":", 1)[0]
        raise ValueError(flag(field_name) + msg[len(field_name):] if field_name in own
                         else msg) from None


def config_to_argv(config: PolicyConfig) -> list[str]:
    """The flags that rebuild ``config`` through ``config_from_args`` (every set field)."""
    argv: list[str] = []
    for f in fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag(f.name) if value else "--no-" + f.name.replace("_", "-"))
        else:
            argv += [flag(f.name), repr(value) if isinstance(value, float) else str(value)]
    return argv


def config_json(config: PolicyConfig) -> str:
    """``config`` as a JSON object (the scheduler's ``Status.policy_config``)."""
    return json.dumps(asdict(config), sort_keys=True)
