"""AccelGen's pivot forward size ``S_pf`` (§3 "Token budget", §4.2), measured.

The paper varies the forward size, measures the batch time and takes the size
at which throughput "nearly saturates" (768 tokens for OPT-13B, 1280 for
OPT-175B). We do the same on the batch-time function the scheduler is allowed
to see — its perf model (``PerfModel.predict``, fitted from the profiling run
and the executed batches), never the simulator's ground truth: a single
prefill of ``n`` tokens (no context) for ``n`` on a grid of ``PIVOT_STEP``
tokens up to ``PIVOT_MAX``; ``S_pf`` is the smallest ``n`` whose tokens/s is at
least ``SATURATION`` of the best tokens/s on the grid. "Nearly saturates" is
not quantified by the paper; 95 % is our reading (docs/accelgen.md).
"""

from __future__ import annotations

from collections.abc import Callable

from sloserve.batch import BatchShape

PIVOT_STEP = 64  # tokens between measured forward sizes
PIVOT_MAX = 8192  # largest forward size measured
SATURATION = 0.95  # share of the best tokens/s that counts as "nearly saturated"


def measure_pivot(
    batch_time: Callable[[BatchShape], float],
    *,
    step: int = PIVOT_STEP,
    max_tokens: int = PIVOT_MAX,
    saturation: float = SATURATION,
) -> int:
    """``S_pf``: the smallest forward size reaching ``saturation`` of the peak tokens/s."""
    if step < 1 or max_tokens < step:
        raise ValueError(f"pivot sweep: need 1 <= step <= max_tokens, got {step}, {max_tokens}")
    if not 0.0 < saturation <= 1.0:
        raise ValueError(f"saturation: must be in (0, 1], got {saturation}")
    sizes = range(step, max_tokens + 1, step)
    rates = []
    for n in sizes:
        t = batch_time(BatchShape(prefills=((n, 0),)))
        if not t > 0:
            raise ValueError(f"batch_time: must be > 0 s, got {t} for a {n}-token prefill")
        rates.append(n / t)
    peak = max(rates)
    return next(n for n, r in zip(sizes, rates, strict=True) if r >= saturation * peak)
