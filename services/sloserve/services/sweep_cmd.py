"""``sloserve sweep SPEC`` and ``sloserve sweep report RESULTS --out DIR`` (issue 37;
docs/sweeps.md): a thin shell over ``sloserve.services.sweep``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sloserve.services.argtypes import positive

TEMPLATES = ("reproduction",)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="run a sweep spec's cells on Ray (or: sweep report RESULTS --out DIR)",
        description="sloserve sweep SPEC runs every cell of a YAML sweep spec as a Ray task "
                    "into a JSON-lines table (cells already there are skipped); "
                    "sloserve sweep report RESULTS --out DIR draws it (docs/sweeps.md)")
    p.add_argument("spec", metavar="SPEC", help="the spec (YAML), or `report`")
    p.add_argument("table", metavar="RESULTS", nargs="?",
                   help="with `report`: the results table to draw")
    p.add_argument("--results", default=None, metavar="FILE",
                   help="the table (JSON lines) rows stream into and resume from "
                        "(default: SPEC with .results.jsonl for .yaml)")
    p.add_argument("--workers", type=positive(int), default=1,
                   help="CPUs of the local Ray started on demand: cells run at once "
                        "(default 1; ignored with --ray-address)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="join this Ray cluster (e.g. 127.0.0.1:6380) instead of local Ray")
    p.add_argument("--max-retries", type=int, default=None, metavar="N",
                   help="times Ray re-runs a cell whose worker or node died (default 3)")
    p.add_argument("--costs", default=None, metavar="TABLE",
                   help="an earlier table of these cells: their cpu_s order the run, longest "
                        "first (default: estimated from requests x probes)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cells (hash, command, done or not) and run nothing")
    p.add_argument("--out", default=None, metavar="DIR", help="with `report`: where to write")
    p.add_argument("--template", choices=TEMPLATES, default=None,
                   help="with `report`: render a document instead of the plots; "
                        "`reproduction`: RESULTS is the folder of the reproduction specs "
                        "(infra/sweeps), OUT the docs folder (writes OUT/reproduction.md)")
    p.add_argument("--cells", default=None, metavar="HASH[,HASH]",
                   help="run only these cells of the spec (hashes or unique prefixes, as "
                        "--dry-run prints them)")


def default_results(spec: Path) -> Path:
    return spec.with_name(spec.stem + ".results.jsonl")


def run(args: argparse.Namespace) -> int:
    from sloserve.services.sweep.runner import (
        MAX_RETRIES,
        done_cells,
        read_table,
        run_sweep,
        table_costs,
    )
    from sloserve.services.sweep.spec import load_spec, select_cells

    if args.spec == "report":
        if args.table is None and args.template is not None:
            raise ValueError(f"report --template {args.template}: give the folder of its "
                             "specs (sloserve sweep report infra/sweeps --template "
                             f"{args.template} --out docs)")
        if args.table is None:
            raise ValueError("report: give the RESULTS table (sloserve sweep report "
                             "RESULTS --out DIR)")
        if args.out is None:
            raise ValueError("--out: required with report (the folder to write)")
        if args.template == "reproduction":
            from sloserve.services.sweep.reproduction import write_reproduction

            print(write_reproduction(Path(args.table), Path(args.out)))
            return 0
        from sloserve.services.sweep.report import write_report

        index = write_report(Path(args.table), Path(args.out))
        print(index)
        return 0
    if args.table is not None:
        raise ValueError(f"RESULTS: only `report` takes a second argument, got {args.table!r} "
                         "(to name the table: --results FILE)")
    if args.out is not None:
        raise ValueError("--out: only with `report`")
    if args.template is not None:
        raise ValueError("--template: only with `report`")
    if args.max_retries is not None and args.max_retries < 0:
        raise ValueError(f"--max-retries: must be >= 0, got {args.max_retries}")
    spec = load_spec(args.spec)
    only = None if args.cells is None else select_cells(spec, args.cells)
    results = Path(args.results) if args.results else default_results(Path(args.spec))
    if args.dry_run:
        done = done_cells(read_table(results)) if results.exists() else set()
        for c in spec.cells:
            if only is not None and c.hash not in only:
                continue
            print(f"{c.hash}  {'done' if c.hash in done else 'todo'}  {c.command()}")
        return 0
    stats = run_sweep(spec, results, workers=args.workers, address=args.ray_address,
                      max_retries=MAX_RETRIES if args.max_retries is None else args.max_retries,
                      only=only, costs=None if args.costs is None else table_costs(
                          Path(args.costs)))
    print(f"{results}: {len(stats.computed)} computed, {len(stats.skipped)} already there, "
          f"{len(stats.failed)} failed, on {len(stats.nodes)} node(s), {stats.wall_s}s")
    return 1 if stats.failed else 0

