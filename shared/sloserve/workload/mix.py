"""A mixed-prompt dataset drawn from several traces (AccelGen §3 "Datasets").

The paper combines Alpaca, ShareGPT and BookCorpus by "random selection with
replacement ... a dataset of 20K requests ... 35% of the requests originated
from BookCorpus". ``mix_traces`` does the same with any named traces and
shares; ``write_trace_csv`` stores the result as a trace file (``--trace-file``).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sloserve.workload.traces import TraceRequest, load_trace


def mix_traces(
    shares: Mapping[str, float], size: int = 20_000, seed: int = 0
) -> list[TraceRequest]:
    """``size`` rows, ``round(share·size)`` from each named trace (with replacement), shuffled."""
    if size < 1:
        raise ValueError(f"size: must be >= 1, got {size}")
    if not shares or any(not 0.0 < s <= 1.0 for s in shares.values()):
        raise ValueError(f"shares: each must be in (0, 1], got {dict(shares)}")
    if abs(sum(shares.values()) - 1.0) > 1e-9:
        raise ValueError(f"shares: must sum to 1, got {sum(shares.values())}")
    rng = np.random.default_rng(seed)
    rows: list[TraceRequest] = []
    names = list(shares)
    for k, name in enumerate(names):
        n = size - len(rows) if k == len(names) - 1 else round(shares[name] * size)
        trace = load_trace(name)
        rows += [trace[i] for i in rng.choice(len(trace), size=n, replace=True)]
    order = rng.permutation(len(rows))
    return [TraceRequest(rows[i].prompt_len, rows[i].output_len) for i in order]


def write_trace_csv(rows: Sequence[TraceRequest], path: str | Path) -> Path:
    """``rows`` as a CSV trace (``input_len,output_len``) that ``load_trace_file`` reads."""
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["input_len", "output_len"])
        w.writerows((r.prompt_len, r.output_len) for r in rows)
    return path
