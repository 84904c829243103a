"""Cells of a re-run table against the checked-in one, by cell hash (issue 37, item 4).

For every cell in RERUN: the capacity (a capacity cell) or each result figure the
checked-in row has (a fixed-rate cell; a converted row keeps a subset), compared exactly;
a capacity cell's probes too (rate, goodput share, P99 TBT, median scheduling delay,
token share, verdict). Prints one line per cell and exits 1 on any difference.

    PYTHONPATH=shared:services python infra/bench/sweep_compare.py \\
        infra/sweeps/reproduction_ascendra.results.jsonl /tmp/rerun.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sloserve.services.sweep.runner import read_table

PROBE_KEYS = (
    "qps",
    "goodput_share",
    "tbt_token_p99",
    "sched_delay_p50",
    "token_criterion_share",
    "meets",
)


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two results of one cell (empty: bit for bit the same)."""
    if "capacity_qps" in old:
        out = (
            []
            if old["capacity_qps"] == new["capacity_qps"]
            else [f"capacity {old['capacity_qps']} -> {new['capacity_qps']}"]
        )
        if "probes" not in old:  # a converted row kept the capacity alone
            return out
        if len(old["probes"]) != len(new["probes"]):
            out.append(f"{len(old['probes'])} probes -> {len(new['probes'])}")
        for i, (a, b) in enumerate(zip(old["probes"], new["probes"])):
            out += [
                f"probe {i} {k}: {a.get(k)} -> {b.get(k)}"
                for k in PROBE_KEYS
                if a.get(k) != b.get(k)
            ]
        return out
    return [f"{k}: {v} -> {new.get(k)}" for k, v in old.items() if new.get(k) != v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checked_in", type=Path)
    ap.add_argument("rerun", type=Path)
    a = ap.parse_args(argv)
    for p in (a.checked_in, a.rerun):
        if not p.is_file():
            ap.error(f"{p}: no such file")
    old = {r["cell"]: r for r in read_table(a.checked_in) if "error" not in r}
    bad = 0
    rows = read_table(a.rerun)
    ok = {r["cell"] for r in rows if "error" not in r}
    # an error row a later run of the same cell superseded (a resumed sweep) is not a result
    for row in (r for r in rows if "error" not in r or r["cell"] not in ok):
        cell, labels = row["cell"], " ".join(row["labels"].values())
        if "error" in row or cell not in old:
            print(
                f"{cell} {labels}: {'error' if 'error' in row else 'not in the checked-in table'}"
            )
            bad += 1
            continue
        diff = differences(old[cell]["result"], row["result"])
        what = (
            f"capacity {row['result']['capacity_qps']}"
            if "capacity_qps" in row["result"]
            else f"{len(old[cell]['result'])} figures"
        )
        print(
            f"{cell} {labels}: "
            + ("same " + what if not diff else "; ".join(diff))
            + f" (cpu {row.get('cpu_s')} s, wall {row.get('wall_s')} s)"
        )
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
