"""One workload under several draws of the ground truth's noise: the simulator's spread.

A simulation draws every batch's run-to-run noise (``noise_cv``) from a seeded stream,
so its result is one sample of what the simulated deployment can give. For most
policies the samples agree to a percent or two; Ascendra's offload threshold (§3.3)
flips on sub-millisecond shifts, after which every later decision differs, and its
tails at high load spread by ~10 % between draws at 600 requests (docs/lab/live-stack.md,
"A quiet AVX-512 host, and the simulator's spread"). ``simulate_draws`` runs draw
``i`` with the ground-truth seed ``truth_seed + i`` (draw 0 is the plain simulation)
and reports, for every number
that differs between draws, the median as the prediction and ``[min, max]`` as the
band; numbers equal in every draw (the config's) and nested objects are draw 0's.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from sloserve.sim.config import SimConfig


def _number(v: Any) -> bool:
    """An int or a float that is not NaN (a metric with no samples is NaN)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def simulate_draws(cfg: SimConfig, draws: int) -> dict[str, Any]:
    """``draws`` simulations of ``cfg``, seeds ``truth_seed .. truth_seed + draws - 1``:
    draw 0's summary with each varying number replaced by its median over the draws,
    plus ``noise_draws`` (the seeds, each varying number's range, draw 0's values)."""
    from sloserve.sim.simulator import simulate

    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"noise_draws (--noise-draws): must be an integer >= 1, got {draws!r}")
    if draws > 1 and cfg.noise_cv == 0:
        raise ValueError("noise_draws (--noise-draws): needs --noise-cv > 0; with no noise "
                         "every draw is the same simulation")
    seeds = [cfg.truth_seed + i for i in range(draws)]
    outs = [simulate(dataclasses.replace(cfg, noise_seed=s)) for s in seeds]
    out = dict(outs[0])
    band: dict[str, list[float]] = {}
    first: dict[str, Any] = {}
    for key, v0 in outs[0].items():
        got = [o.get(key) for o in outs]
        if not all(_number(v) for v in got) or len(set(got)) == 1:
            continue
        vals: list[float] = [float(v) for v in got if v is not None]
        if all(isinstance(v, int) for v in got):  # counts stay integers
            out[key] = int(statistics.median_low(vals))
            band[key] = [int(min(vals)), int(max(vals))]
        else:
            out[key] = statistics.median(vals)
            band[key] = [min(vals), max(vals)]
        first[key] = v0
    out["noise_draws"] = {"draws": draws, "noise_seeds": seeds, "range": band,
                          "first_draw": first}
    return out
