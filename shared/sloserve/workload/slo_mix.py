"""Per-request SLOs: none, one uniform SLO, or AccelGen's heterogeneous mix.

``hetero`` follows AccelGen §3 ("Measurement results") and §6.1:

* prompts are grouped by length in ranges of 512 tokens; a group's latency is
  the *average prompt-processing latency* of the prompts in that group (the
  paper measured it on Triton/FasterTransformer; we ask a batch-time function —
  a :class:`~sloserve.perf.base.PerfModel`'s ``predict`` or a ground-truth
  ``TimingSource.batch_time`` — for the whole prompt as one prefill);
* TTFT SLO = group latency × SLO-scale, scale ~ U[0.5, 1.5] per request;
* TBT SLO = 0.1875 s (normal reading speed) × scale, scale ~ U[0.75, 1.25]
  (§6.1; §3's measurement used {0.25, 0.5, 1, 2}, which the evaluation replaced).

The paper reports JCT-SLO attainment for offline requests (§4.3, Fig. 11c) but
never says how many requests are offline or how their JCT SLO was set. Our
choice: a share ``jct_share`` (default 0) of requests are offline, with only a
JCT SLO = (group latency + output_len × 0.1875 s) × U[0.5, 1.5], i.e. the time
the request would take at the TTFT and reading-speed anchors, scaled like TTFT.
The paper assigns no priorities, so every request keeps priority 0.

``ttft_slo``/``tbt_slo`` given with ``hetero`` are the scale *anchors*: they
replace the group latency (then every group shares that anchor) and the
0.1875 s reading speed, respectively.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sloserve.batch import BatchShape
from sloserve.defaults import READING_SPEED_TBT
from sloserve.request import SLO

SLO_MIXES = ("none", "uniform", "hetero")
LENGTH_GROUP = 512  # tokens per prompt-length group, AccelGen §3
TTFT_SCALE = (0.5, 1.5)  # AccelGen §3
TBT_SCALE = (0.75, 1.25)  # AccelGen §6.1
JCT_SCALE = (0.5, 1.5)  # ours: the paper does not say

BatchTime = Callable[[BatchShape], float]


def uniform_slos(
    n: int, *, ttft_slo: float | None, tbt_slo: float | None, jct_slo: float | None = None
) -> list[SLO]:
    """The same SLO for every request (``SLO`` validates that each is > 0)."""
    return [SLO(ttft=ttft_slo, tbt=tbt_slo, jct=jct_slo) for _ in range(n)]


def group_latencies(prompt_lens: Sequence[int], batch_time: BatchTime) -> np.ndarray:
    """Per request, the mean prefill latency of its 512-token prompt-length group."""
    lens = np.asarray(prompt_lens, dtype=np.int64)
    unique, inverse = np.unique(lens, return_inverse=True)
    latency = np.array([batch_time(BatchShape(prefills=((int(p), 0),))) for p in unique])
    per_request = latency[inverse]
    groups = lens // LENGTH_GROUP
    sums = np.bincount(groups, weights=per_request)
    counts = np.bincount(groups)
    return np.asarray((sums / np.maximum(counts, 1))[groups], dtype=np.float64)


def hetero_slos(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    rng: np.random.Generator,
    *,
    batch_time: BatchTime | None = None,
    ttft_slo: float | None = None,
    tbt_slo: float | None = None,
    jct_share: float = 0.0,
) -> list[SLO]:
    """AccelGen's heterogeneous SLO mix (module docstring has the rules)."""
    n = len(prompt_lens)
    if len(output_lens) != n:
        raise ValueError("output_lens: must have one entry per prompt")
    if not 0.0 <= jct_share <= 1.0:
        raise ValueError(f"jct_share (--jct-share): must be in [0, 1], got {jct_share!r}")
    for name, value in (("ttft_slo (--ttft-slo)", ttft_slo), ("tbt_slo (--tbt-slo)", tbt_slo)):
        if value is not None and not value > 0:
            raise ValueError(f"{name}: must be > 0 seconds, got {value!r}")
    if ttft_slo is not None:
        ttft_base = np.full(n, ttft_slo)
    elif batch_time is not None:
        ttft_base = group_latencies(prompt_lens, batch_time)
    else:
        raise ValueError(
            "slo_mix hetero: needs a prefill-latency source (perf model) for the "
            "per-group TTFT anchor, or --ttft-slo as a fixed anchor"
        )
    tbt_base = READING_SPEED_TBT if tbt_slo is None else tbt_slo
    ttft = ttft_base * rng.uniform(*TTFT_SCALE, size=n)
    tbt = tbt_base * rng.uniform(*TBT_SCALE, size=n)
    jct = (ttft_base + np.asarray(output_lens) * tbt_base) * rng.uniform(*JCT_SCALE, size=n)
    offline = rng.random(n) < jct_share
    return [
        SLO(jct=float(jct[i])) if offline[i] else SLO(ttft=float(ttft[i]), tbt=float(tbt[i]))
        for i in range(n)
    ]
