"""A sweep spec (YAML) expanded into cells (issue 37, item 1; docs/sweeps.md).

A spec names axes; each axis is a list of items, each item a mapping of ``sloserve
simulate``/``capacity`` options (their flag names with ``_``: ``tbt_slo``, ``trace_file``,
a policy knob such as ``token_budget``) or a scalar when the axis is named after one
option (``seed: [0, 1]``). ``measure`` says what each point of the cross product runs:
fixed-rate simulations (``rates``) and/or capacity searches (``capacity``, one per
criterion). Each cell is the exact command line of the ``simulate`` or ``capacity`` command
it stands for, parsed by that command's own parser and checked by its own
``config_from_args``, so a cell's numbers are that command's. A cell is named by the
content hash of its resolved options (every option's value after defaults; a file option
by its content's hash, not its path).

Every problem is found before anything runs and raised as ``SpecError`` naming the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

KINDS = ("simulate", "capacity")
CRITERIA = ("goodput", "tail", "token")
TOP_KEYS = ("name", "options", "axes", "measure", "overrides")
OVERRIDE_KEYS = ("when", "set")
MEASURE_KEYS = ("rates", "capacity")
CAPACITY_KEYS = ("criteria", "target", "qps_start", "rel_tol")
# set by ``measure``, not by an axis or ``options``; ``json`` is the shell's, not the run's
RESERVED = frozenset({"qps", "criterion", "target", "qps_start", "json", "help", "command"})
FILE_OPTIONS = ("trace_file", "timing_profile", "overhead_profile")
# Options added after tables were written, with the value that runs exactly as before the
# option existed: at that value a cell's hash leaves them out, so adding an option does not
# orphan every table's rows (`simulate --no-prefix-cache-outputs`, issue 33's multi-turn
# line: on by default, as every run before it). Any other value is hashed as usual.
AS_BEFORE = {"prefix_cache_outputs": True}
REL_TOL = 0.05  # find_capacity's default bisection stop, the `capacity` command's


class SpecError(ValueError):
    """A spec problem, naming the key (``axes.slo[1].tbt_slo: ...``)."""


class _Raise(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SpecError(message)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """The ``simulate`` and ``capacity`` commands' own parsers."""
    from sloserve.services import sim_cmd

    root = _Raise(prog="sloserve")
    sub = root.add_subparsers(dest="command", parser_class=_Raise)
    sim_cmd.add_parser(sub)
    return {k: sub.choices[k] for k in KINDS}


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in RESERVED}


@dataclass(frozen=True)
class Cell:
    """One simulation or capacity search: ``sloserve KIND *argv`` (plus ``rel_tol``)."""

    kind: str
    argv: tuple[str, ...]
    config: dict[str, Any]  # resolved options (None-valued, i.e. unset, left out)
    labels: dict[str, str]  # axis -> the item's label, plus "measure"
    hash: str
    rel_tol: float = REL_TOL
    where: dict[str, str] = field(default_factory=dict, compare=False)  # option -> spec key

    def command(self) -> str:
        """The equivalent command line (for the table and the report)."""
        extra = "" if self.rel_tol == REL_TOL else f"  # rel_tol {self.rel_tol}"
        return " ".join(("sloserve", self.kind, *self.argv)) + extra


@dataclass(frozen=True)
class Spec:
    name: str
    cells: tuple[Cell, ...]
    path: Path | None = None


def _fail(where: str, msg: str) -> NoReturn:
    raise SpecError(f"{where}: {msg}")


def _mapping(x: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(x, Mapping):
        _fail(where, f"must be a mapping, got {type(x).__name__}")
    for k in x:
        if not isinstance(k, str):
            _fail(where, f"keys must be strings, got {k!r}")
    return x


def _list(x: Any, where: str) -> list[Any]:
    if isinstance(x, (str, bytes, Mapping)) or not isinstance(x, Sequence):
        _fail(where, f"must be a list, got {type(x).__name__}")
    if not x:
        _fail(where, "must not be empty")
    return list(x)


def _number(x: Any, where: str, lo: float, hi: float = math.inf, lo_open: bool = True) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        _fail(where, f"must be a number, got {x!r}")
    if x < lo or (lo_open and x == lo) or x > hi:
        _fail(where, f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {x!r}")
    return float(x)


def _option(name: str, value: Any, where: str, known: Mapping[str, argparse.Action]) -> None:
    if name not in known:
        hint = (" (set by measure)" if name in RESERVED else
                f" (known: {', '.join(sorted(known))})")
        _fail(where, f"unknown option{hint}")
    if value is not None and not isinstance(value, (bool, int, float, str)):
        _fail(where, f"must be a scalar, got {type(value).__name__}")


def _label(item: Any, axis: str) -> str:
    if not isinstance(item, Mapping):
        return str(item)
    if "label" in item:
        return str(item["label"])
    own = [f"{v}" if k == axis or k == "policy" else f"{k}={v}" for k, v in item.items()
           if k != "measure"]
    return " ".join(own)


def _to_argv(values: Mapping[str, Any], actions: Mapping[str, argparse.Action],
             where: Mapping[str, str]) -> list[str]:
    argv: list[str] = []
    for name, value in values.items():
        if value is None:
            continue
        act = actions[name]
        flag = act.option_strings[0]
        if isinstance(act, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                _fail(where[name], f"must be true or false, got {value!r}")
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(act, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if not isinstance(value, bool):
                _fail(where[name], f"must be true or false, got {value!r}")
            if value != act.default:
                argv.append(flag)
        else:
            if isinstance(value, bool):
                _fail(where[name], f"must not be true/false, got {value!r}")
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def _file_digest(path: str, where: str) -> str:
    p = Path(path)
    if not p.is_file():
        _fail(where, f"no such file: {path}")
    return "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()


@functools.cache
def _trace_problem(trace: str | None, trace_file: str | None) -> str | None:
    """What stops the simulator reading this workload's lengths (None: nothing)."""
    from sloserve.workload.multiturn import MULTITURN
    from sloserve.workload.traces import TraceError, load_trace, load_trace_file

    try:
        if trace_file is not None:
            load_trace_file(trace_file)
        elif trace is not None and trace != MULTITURN:
            load_trace(trace)
    except TraceError as exc:
        return str(exc)
    return None


def _check_trace(config: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """A trace name or file the run could not read, found before anything runs."""
    problem = _trace_problem(config.get("trace"), config.get("trace_file"))
    if problem is not None:
        key = "trace_file" if config.get("trace_file") is not None else "trace"
        _fail(where.get(key, key), problem)


def without_as_before(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` less the options at their ``AS_BEFORE`` value (what a cell's hash covers)."""
    return {k: v for k, v in config.items() if k not in AS_BEFORE or v != AS_BEFORE[k]}


def cell_hash(kind: str, config: Mapping[str, Any], rel_tol: float) -> str:
    """16 hex digits of the SHA-256 of the resolved config (file options by content)."""
    body = json.dumps({"kind": kind, "config": config, "rel_tol": rel_tol},
                      sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _resolve(kind: str, values: dict[str, Any], where: dict[str, str],
             measure: dict[str, Any], parser: argparse.ArgumentParser,
             rel_tol: float) -> tuple[tuple[str, ...], dict[str, Any], str]:
    from sloserve.services.sim_cmd import config_from_args

    actions = _actions(parser)
    for name in values:
        if name not in actions:
            _fail(where[name], f"not an option of `sloserve {kind}`")
    argv = _to_argv(values, actions, where)
    argv += [t for k, v in measure.items() for t in (f"--{k.replace('_', '-')}", str(v))]
    try:
        ns = parser.parse_args(argv)
    except SpecError as exc:
        if " required" in str(exc) and not str(exc).startswith("argument "):
            wanted = re.findall(r"--([\w-]+)", str(exc))
            _fail("/".join(w.replace("-", "_") for w in wanted),
                  "required (set it in options or on an axis)")
        m = re.search(r"argument (--[\w-]+)", str(exc))
        dest = next((d for d, a in actions.items() if m and m.group(1) in a.option_strings),
                    None)
        _fail(where.get(dest, "measure") if dest else "spec", str(exc))
    try:
        resolved = config_from_args(ns, getattr(ns, "qps", 1.0))
    except ValueError as exc:
        msg = str(exc)
        key = msg.split(":", 1)[0].strip().lstrip("-").replace("-", "_").split(" ")[0]
        _fail(where.get(key, "spec " + " ".join(f"{k}={v}" for k, v in values.items())), msg)
    given = {k: v for k, v in vars(ns).items() if v is not None and k not in ("json", "command")}
    # the Deployment's defaults filled in (its flags parse to None until resolved), so a
    # cell's hash names what runs, not how it was written
    filled = {f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)
              if f.name not in given and not (kind == "capacity" and f.name == "qps")
              and isinstance(getattr(resolved, f.name), str | int | float)}
    config = dict(sorted({**filled, **given}.items()))
    _check_trace(config, where)
    hashed = without_as_before(config)
    for name in FILE_OPTIONS:
        if name in config:
            hashed[name] = _file_digest(config[name], where.get(name, name))
    return tuple(argv), config, cell_hash(kind, hashed, rel_tol)


Measure = tuple[str, dict[str, Any], str, float]
# an axis item: its options, where it is, its label, its own measurements (None: the top's)
Item = tuple[dict[str, Any], str, str, "list[Measure] | None"]


def _measures(measure: Mapping[str, Any], at: str = "measure") -> Iterator[Measure]:
    """(kind, options the measure sets, label, rel_tol) for each measurement of a point."""
    if not any(k in measure for k in MEASURE_KEYS):
        _fail(at, f"give rates and/or capacity (keys: {', '.join(MEASURE_KEYS)})")
    for k in measure:
        if k not in MEASURE_KEYS:
            _fail(f"{at}.{k}", f"unknown key (known: {', '.join(MEASURE_KEYS)})")
    if "rates" in measure:
        for i, r in enumerate(_list(measure["rates"], f"{at}.rates")):
            q = _number(r, f"{at}.rates[{i}]", 0.0)
            yield "simulate", {"qps": q}, f"{q:g} req/s", REL_TOL
    if "capacity" in measure:
        cap = _mapping(measure["capacity"], f"{at}.capacity")
        for k in cap:
            if k not in CAPACITY_KEYS:
                _fail(f"{at}.capacity.{k}", f"unknown key (known: {', '.join(CAPACITY_KEYS)})")
        crit = cap.get("criteria", ["goodput"])
        crits = [crit] if isinstance(crit, str) else _list(crit, f"{at}.capacity.criteria")
        opts: dict[str, Any] = {}
        if "target" in cap:
            opts["target"] = _number(cap["target"], f"{at}.capacity.target", 0.0, 1.0)
        if "qps_start" in cap:
            opts["qps_start"] = _number(cap["qps_start"], f"{at}.capacity.qps_start", 0.0)
        rel_tol = (_number(cap["rel_tol"], f"{at}.capacity.rel_tol", 0.0, 1.0)
                   if "rel_tol" in cap else REL_TOL)
        for i, c in enumerate(crits):
            if c not in CRITERIA:
                _fail(f"{at}.capacity.criteria[{i}]",
                      f"must be one of {', '.join(CRITERIA)}, got {c!r}")
            yield "capacity", {"criterion": c, **opts}, f"capacity {c}", rel_tol


def parse_spec(doc: Any, base: Path | None = None, name: str = "sweep") -> Spec:
    """The cells of a spec document (already loaded from YAML); relative file options are
    read against ``base`` (the spec's folder). Raises ``SpecError`` naming the key."""
    parsers = _parsers()
    known = {**_actions(parsers["simulate"]), **_actions(parsers["capacity"])}
    top = _mapping(doc, "spec")
    for k in top:
        if k not in TOP_KEYS:
            _fail(k, f"unknown key (known: {', '.join(TOP_KEYS)})")
    spec_name = str(top.get("name", name))
    fixed = _mapping(top.get("options", {}), "options")
    for k, v in fixed.items():
        _option(k, v, f"options.{k}", known)
    axes = [(axis, [_axis_item(axis, i, item, known)
                    for i, item in enumerate(_list(items, f"axes.{axis}"))])
            for axis, items in _mapping(top.get("axes", {}), "axes").items()]
    measures = (list(_measures(_mapping(top["measure"], "measure")))
                if "measure" in top else None)
    rules = _overrides(top.get("overrides", []), known) if "overrides" in top else []
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    hits = [0] * len(rules)
    for point in itertools.product(*(items for _, items in axes)):
        pt = _point(fixed, axes, point, measures, base)
        for i, rule in enumerate(rules):
            hits[i] += _apply(rule, pt)
        cells += _point_cells(pt, parsers, seen)
    for rule, n in zip(rules, hits):
        if not n:
            _fail(f"{rule.at}.when", "matches no cell (compare the values the axes set, "
                                     "e.g. 3 and not '3')")
    return Spec(name=spec_name, cells=tuple(cells))


@dataclass(frozen=True)
class _Rule:
    """``overrides[i]``: options set on the cells whose options equal ``when`` (a per-cell
    knob the cross product cannot say, e.g. Ascendra's HP instance on three instances only)."""

    when: dict[str, Any]
    set: dict[str, Any]
    at: str


def _overrides(doc: Any, known: Mapping[str, argparse.Action]) -> list[_Rule]:
    rules = []
    for i, item in enumerate(_list(doc, "overrides")):
        at = f"overrides[{i}]"
        rule = _mapping(item, at)
        for k in rule:
            if k not in OVERRIDE_KEYS:
                _fail(f"{at}.{k}", f"unknown key (known: {', '.join(OVERRIDE_KEYS)})")
        parts = []
        for key in OVERRIDE_KEYS:
            if key not in rule:
                _fail(f"{at}.{key}", "missing")
            body = _mapping(rule[key], f"{at}.{key}")
            if not body:
                _fail(f"{at}.{key}", "must not be empty")
            for k, v in body.items():
                _option(k, v, f"{at}.{key}.{k}", known)
                if key == "set" and k in FILE_OPTIONS:
                    _fail(f"{at}.set.{k}", "a file option is set on an axis, not here")
            parts.append(dict(body))
        rules.append(_Rule(when=parts[0], set=parts[1], at=at))
    return rules


def _apply(rule: _Rule, pt: _Point) -> bool:
    """Set ``rule.set`` on ``pt`` when its options match ``rule.when``; True if they did."""
    if any(pt.values.get(k) != v for k, v in rule.when.items()):
        return False
    for k, v in rule.set.items():
        pt.values[k], pt.where[k] = v, f"{rule.at}.set.{k}"
    return True


def _axis_item(axis: str, i: int, item: Any, known: dict[str, Any]) -> Item:
    """One item of an axis: its options, where it is, its label, its own measures."""
    at = f"axes.{axis}[{i}]"
    own: list[Measure] | None = None
    if isinstance(item, Mapping):
        body = {k: v for k, v in _mapping(item, at).items() if k not in ("label", "measure")}
        if "measure" in item:  # this item's own rates / capacity search
            own = list(_measures(_mapping(item["measure"], f"{at}.measure"), f"{at}.measure"))
        if not body and own is None:
            _fail(at, "sets no option")
    else:
        if axis not in known:
            _fail(at, f"a bare value needs an axis named after an option; "
                      f"{axis!r} is not one (use a mapping such as {{tbt_slo: 0.1}})")
        body = {axis: item}
    for k, v in body.items():
        _option(k, v, f"{at}.{k}", known)
    return (dict(body), at, _label(item, axis), own)


@dataclass(frozen=True)
class _Point:
    """One point of the axes' cross product: its options, where each was set, its labels
    and what it measures."""

    values: dict[str, Any]
    where: dict[str, str]
    labels: dict[str, str]
    measures: list[Measure]


def _point(fixed: Mapping[str, Any], axes: list[tuple[str, list[Item]]], point: tuple[Item, ...],
           measures: list[Measure] | None, base: Path | None) -> _Point:
    values: dict[str, Any] = dict(fixed)
    where = {k: f"options.{k}" for k in fixed}
    labels: dict[str, str] = {}
    point_measures, measured_by = measures, "measure"
    for (axis, _), (body, at, label, own) in zip(axes, point):
        if own is not None:
            if measured_by != "measure":
                _fail(f"{at}.measure", f"also set by {measured_by} (one per cell)")
            point_measures, measured_by = own, f"{at}.measure"
        for k, v in body.items():
            if k in where and not where[k].startswith("options."):
                _fail(f"{at}.{k}", f"also set by {where[k]} (one axis per option)")
            values[k], where[k] = v, f"{at}.{k}"
        labels[axis] = label
    for name_ in FILE_OPTIONS:
        v = values.get(name_)
        if isinstance(v, str) and base is not None and not Path(v).is_absolute():
            values[name_] = str((base / v).resolve())
    if point_measures is None:
        _fail("measure", "missing (what each cell runs: rates and/or capacity, at the top "
                         "or on an axis item)")
    return _Point(values, where, labels, point_measures)


def _point_cells(pt: _Point, parsers: dict[str, Any], seen: dict[str, str]) -> list[Cell]:
    """The cells one point runs, one per measure; ``seen`` (hash -> where) refuses a cell
    that resolves to the config of another."""
    cells = []
    for kind, mopts, mlabel, rel_tol in pt.measures:
        if kind == "capacity" and pt.values.get("noise_draws") not in (None, 1):
            _fail(pt.where["noise_draws"], "only fixed-rate cells draw noise several times")
        vals = {k: v for k, v in pt.values.items()
                if not (kind == "capacity" and k == "noise_draws")}
        argv, config, h = _resolve(kind, vals, pt.where, mopts, parsers[kind], rel_tol)
        here = ", ".join(f"{a}={lab}" for a, lab in pt.labels.items()) + f", {mlabel}"
        if h in seen:
            _fail("axes", f"two cells resolve to the same config: {seen[h]} and {here}")
        seen[h] = here
        cells.append(Cell(kind=kind, argv=argv, config=config,
                          labels={**pt.labels, "measure": mlabel}, hash=h, rel_tol=rel_tol,
                          where=pt.where))
    return cells


def load_spec(path: str | Path) -> Spec:
    """``parse_spec`` of a YAML file (names relative files against its folder)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not YAML ({exc})") from None
    spec = parse_spec(doc, base=p.resolve().parent, name=p.stem)
    return Spec(name=spec.name, cells=spec.cells, path=p)


def select_cells(spec: Spec, hashes: str) -> frozenset[str]:
    """The hashes of the cells of ``spec`` named in ``hashes`` (comma-separated hashes or
    unique prefixes, ``--cells``); a prefix matching no cell or several is a ``SpecError``."""
    wanted = [h.strip() for h in hashes.split(",") if h.strip()]
    if not wanted:
        raise SpecError("--cells: give at least one cell hash")
    keep: set[str] = set()
    for h in wanted:
        hits = [c.hash for c in spec.cells if c.hash.startswith(h)]
        if len(hits) != 1:
            raise SpecError(f"--cells: {h!r} names {len(hits)} cells of {spec.name} "
                            "(want one; `sloserve sweep SPEC --dry-run` lists them)")
        keep.add(hits[0])
    return frozenset(keep)
