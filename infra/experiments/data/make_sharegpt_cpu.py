"""Write ``sharegpt_cpu.csv``: the vendored ShareGPT trace scaled for a CPU run.

Every prompt and output length is divided by ``SCALE`` (16), rounded up (so
no request is empty), and capped so prompt + output fits the tiny model's
2048-token context. Row order is the trace's; no arrivals (bench and simulate
draw Poisson arrivals from ``--qps``). Deterministic: re-running gives the
same file.

    python infra/experiments/data/make_sharegpt_cpu.py
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from sloserve.workload.traces import load_trace

SCALE = 8
MAX_CONTEXT = 2048  # tiny's max_context
OUT = Path(__file__).with_name("sharegpt_cpu.csv")


def main() -> None:
    with OUT.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt_len", "output_len"])
        for r in load_trace("sharegpt"):
            prompt = math.ceil(r.prompt_len / SCALE)
            output = min(math.ceil(r.output_len / SCALE), MAX_CONTEXT - prompt)
            w.writerow([prompt, output])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
