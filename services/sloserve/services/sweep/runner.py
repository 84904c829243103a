"""A sweep's cells as Ray tasks, streamed into one JSON-lines table (issue 37, item 2).

Local Ray started on demand is the default (``num_cpus`` = workers); an address joins a
cluster. Each finished cell appends one row (cell hash, resolved config, result, the
node and host it ran on, wall time) and is flushed at once, so a killed sweep keeps every
finished cell and a re-run computes only the cells whose hash is not in the table (a
half-written last line, from a kill mid-write, is dropped). A task lost with its node is
re-run by Ray elsewhere (``max_retries``); a cell that raises is recorded with its error
and tried again by the next run.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from sloserve.services.sweep.spec import Cell, Spec, _parsers

MAX_RETRIES = 3  # a cell's task re-run after its worker or node died
PROBES = 8  # a capacity search's simulations, about (doubling, then bisection to 5 %)


def cost_estimate(cell: Cell) -> float:
    """A cell's work before it has run: requests simulated (a capacity search's probes
    times ``num_requests``; a fixed-rate cell's draws times ``num_requests``)."""
    runs = PROBES if cell.kind == "capacity" else int(cell.config.get("noise_draws") or 1)
    return float(cell.config.get("num_requests") or 1) * runs


def longest_first(cells: list[Cell], costs: dict[str, float] | None = None) -> list[Cell]:
    """The cells in submission order: longest first (Graham's LPT rule), so the last to
    start are short and the workers finish together instead of one running a long cell
    alone at the end. A cell's cost is its ``cpu_s`` from an earlier table (``costs``, by
    hash or, for a table written before an option was added, by command line) when every
    cell has one, else ``cost_estimate``; ties keep the spec's order."""
    known = costs or {}
    cost = {c.hash: known.get(c.hash, known.get(c.command())) for c in cells}
    if cells and all(v is not None for v in cost.values()):
        return sorted(cells, key=lambda c: -(cost[c.hash] or 0.0))
    return sorted(cells, key=lambda c: -cost_estimate(c))


def table_costs(path: Path) -> dict[str, float]:
    """``cpu_s`` by cell hash and by command line from a table (the last row per cell)."""
    if not path.is_file():
        raise ValueError(f"--costs: no such file: {path}")
    out: dict[str, float] = {}
    for r in read_table(path):
        if isinstance(r.get("cpu_s"), (int, float)) and "error" not in r:
            out[r["cell"]] = float(r["cpu_s"])
            if isinstance(r.get("command"), str):
                out[r["command"]] = float(r["cpu_s"])
    return out


def run_cell(kind: str, argv: list[str], rel_tol: float) -> dict[str, Any]:
    """One cell, exactly as ``sloserve KIND *argv --json`` computes it (the same parser,
    ``config_from_args`` and entry point), with where and how long it ran."""
    from sloserve.services.sim_cmd import _clean, config_from_args
    from sloserve.sim.capacity import find_capacity
    from sloserve.sim.draws import simulate_draws
    from sloserve.sim.simulator import simulate

    ns = _parsers()[kind].parse_args(argv)
    t0, c0 = time.perf_counter(), time.process_time()
    cfg = config_from_args(ns, getattr(ns, "qps", 1.0))
    out: dict[str, Any]
    if kind == "simulate":
        out = simulate_draws(cfg, ns.noise_draws) if ns.noise_draws > 1 else simulate(cfg)
    else:
        out = find_capacity(cfg, ns.criterion, ns.target, qps_start=ns.qps_start,
                            rel_tol=rel_tol, max_drop_share=ns.max_drop_share)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # not in a Ray worker (a direct call)
        node_id = None
    return {"result": _clean(out), "node_id": node_id, "host": socket.gethostname(),
            "pid": os.getpid(), "wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}


def read_table(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """The table's complete rows. A half-written last line (a kill mid-write, or a sweep
    writing now) is left out; with ``repair`` (the sweep about to append) it is also cut
    off the file, so the next row starts on a fresh line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    rows = []
    for lineno, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not a JSON row ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("cell"), str):
            raise ValueError(f"{path}:{lineno}: a row needs a 'cell' hash")
        rows.append(row)
    return rows


def done_cells(rows: Iterable[dict[str, Any]]) -> set[str]:
    """Hashes of the cells with a result (a recorded error is tried again)."""
    return {r["cell"] for r in rows if "error" not in r}


@dataclass
class SweepStats:
    total: int
    skipped: list[str] = field(default_factory=list)  # already in the table
    computed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    nodes: dict[str, int] = field(default_factory=dict)  # node id -> cells run there
    wall_s: float = 0.0  # from the first task submitted to the last row written


def _code_roots() -> list[str]:
    """The folders this process imports sloserve from: Ray workers import the same code."""
    import sloserve

    roots = {str(Path(p).resolve().parent) for p in sloserve.__path__}
    return sorted(roots)


def _fmt_eta(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Progress:
    """``sweep: 5/16 done, 2 running, 9 queued, 1 failed, ETA 0m12s`` on stderr."""

    def __init__(self, out: TextIO | None, total: int, skipped: int) -> None:
        self.out, self.total, self.skipped = out, total, skipped
        self.tty = bool(out is not None and out.isatty())
        self.last = ""
        self.t0 = time.monotonic()

    def show(self, done: int, running: int, queued: int, failed: int, final: bool = False) -> None:
        if self.out is None:
            return
        elapsed = time.monotonic() - self.t0
        left = running + queued
        eta = elapsed / done * left if done else math.inf
        line = (f"sweep: {done + self.skipped}/{self.total} done ({self.skipped} from the "
                f"table), {running} running, {queued} queued"
                + (f", {failed} failed" if failed else "")
                + (f", ETA {_fmt_eta(eta)}" if left else f", {elapsed:.1f}s"))
        if line == self.last and not final:
            return
        self.last = line
        if self.tty:
            self.out.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def run_sweep(spec: Spec, results: Path, *, workers: int = 1, address: str | None = None,
              max_retries: int = MAX_RETRIES, progress: TextIO | bool = True,
              only: frozenset[str] | None = None,
              costs: dict[str, float] | None = None) -> SweepStats:
    """Run the cells of ``spec`` missing from ``results`` as Ray tasks, appending a row per
    finished cell. Uses the Ray session this process already has, else joins ``address``,
    else starts local Ray with ``workers`` CPUs (and stops what it started). The progress
    line goes to ``progress`` (True: stderr; False: nowhere). ``only``: run just these
    cells (hashes; ``--cells``), the others neither run nor counted. Cells are submitted
    longest first (``longest_first`` with ``costs``, ``cpu_s`` by hash)."""
    try:
        import ray
    except ImportError:
        raise ValueError("ray is not installed: pip install 'sloserve[sweep]'") from None

    rows = read_table(results, repair=True)
    done = done_cells(rows)
    cells = [c for c in spec.cells if only is None or c.hash in only]
    todo = longest_first([c for c in cells if c.hash not in done], costs)
    stats = SweepStats(total=len(cells), skipped=[c.hash for c in cells if c.hash in done])
    out = sys.stderr if progress is True else (None if progress is False else progress)
    bar = _Progress(out, len(cells), len(stats.skipped))
    if not todo:
        bar.show(0, 0, 0, 0, final=True)
        return stats

    started = False
    if not ray.is_initialized():
        path = os.pathsep.join(
            _code_roots() + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        kw: dict[str, Any] = {"log_to_driver": False, "logging_level": "WARNING"}
        if address:
            _check_reachable(address)
            try:
                ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": path}}, **kw)
            except ConnectionError as exc:
                raise ValueError(f"--ray-address: cannot join the Ray cluster at {address} "
                                 f"({exc}); on a cluster with token authentication the "
                                 "token must be this machine's too") from None
        else:  # local Ray's processes inherit this environment: its prestarted workers
            # serve the cells (a runtime env would start new ones, ~0.7 s per sweep here)
            before = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = path
            try:
                _start_local(ray, workers, kw)
            finally:  # the raylet has its copy; this process's environment is as it was
                if before is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = before
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=max_retries)(run_cell)
        results.parent.mkdir(parents=True, exist_ok=True)
        t0 = bar.t0 = time.monotonic()
        pending = {task.remote(c.kind, list(c.argv), c.rel_tol): c for c in todo}
        cpus = _cpus(ray, 1)
        with results.open("a") as table:
            while pending:
                bar.show(len(stats.computed), min(len(pending), cpus),
                         max(0, len(pending) - cpus), len(stats.failed))
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    cell = pending.pop(ref)
                    row = _row(spec, cell)
                    try:
                        row.update(ray.get(ref))
                        stats.computed.append(cell.hash)
                        node = str(row.get("node_id"))
                        stats.nodes[node] = stats.nodes.get(node, 0) + 1
                    except ray.exceptions.RayError as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
                        stats.failed.append(cell.hash)
                    row["finished_at"] = datetime.now(timezone.utc).isoformat(
                        timespec="seconds")
                    table.write(json.dumps(row, allow_nan=False, sort_keys=False) + "\n")
                    table.flush()
                    os.fsync(table.fileno())
                if ready:
                    cpus = _cpus(ray, cpus)
        stats.wall_s = round(time.monotonic() - t0, 3)
        bar.show(len(stats.computed), 0, 0, len(stats.failed), final=True)
    finally:
        if started:
            ray.shutdown()
    return stats


LOCAL_STARTS = 3  # tries at starting local Ray (its raylet gets 30 s to register)


def _start_local(ray: Any, workers: int, kw: dict[str, Any]) -> None:
    """Local Ray with ``workers`` CPUs. Ray gives its raylet a fixed 30 s to register and
    raises a bare ``Exception`` past it, which an overloaded machine reaches (load 50 on
    2 cores here): tried ``LOCAL_STARTS`` times, then a ``ValueError`` saying so."""
    for attempt in range(1, LOCAL_STARTS + 1):
        try:
            ray.init(address="local", num_cpus=workers, include_dashboard=False, **kw)
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc):
                raise
            ray.shutdown()
            if attempt == LOCAL_STARTS:
                raise ValueError(
                    f"local Ray did not start in {LOCAL_STARTS} tries (its raylet did not "
                    f"register in 30 s; 1-minute load {os.getloadavg()[0]:.1f}): try again "
                    "on a less loaded machine, or start a cluster and pass --ray-address"
                ) from None


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` nothing listens on at once (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", ray://…: Ray's own resolution
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(f"--ray-address: nothing answers at {address} ({exc.strerror or exc}); "
                         "start the cluster with `ray start --head --port PORT`") from None


def _cpus(ray: Any, default: int) -> int:
    """The cluster's CPUs now (nodes join and leave): at most this many cells run."""
    resources: dict[str, float] = ray.cluster_resources()
    return max(1, int(resources.get("CPU", default)))


def _row(spec: Spec, cell: Cell) -> dict[str, Any]:
    return {"cell": cell.hash, "spec": spec.name, "index": spec.cells.index(cell),
            "kind": cell.kind, "labels": cell.labels,
            "command": cell.command(), "config": cell.config, "rel_tol": cell.rel_tol}
