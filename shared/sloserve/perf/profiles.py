"""Real per-operator GPU profiles (Vidur ``mlp.csv``, MIT, Microsoft) in ``sloserve.data``.

Each profile row times one transformer block's linear/norm ops at a batch
token count (prefill and decode tokens together) and a TP degree. Vidur fits
its predictor on the ``median`` columns; so do we, in seconds per layer.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

#: Per-layer ops of ``mlp.csv``; ``emb`` (once per model) is kept separately.
LAYER_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
OPS: tuple[str, ...] = ("emb", *LAYER_OPS)

#: (model preset, gpu) -> vendored file (see shared/sloserve/data/profiles/README.md).
_FILES: dict[tuple[str, str], str] = {
    ("llama-2-7b", "a100"): "a100_Llama-2-7b-hf_mlp.csv.gz",
    ("llama-3-8b", "a100"): "a100_Meta-Llama-3-8B_mlp.csv.gz",
    ("llama-2-7b", "h100"): "h100_Llama-2-7b-hf_mlp.csv.gz",
}
_GPU_ALIASES = {"a100-80g": "a100", "a100-80gb": "a100", "h100-sxm": "h100"}


def available_profiles() -> list[tuple[str, str]]:
    """(model preset, gpu) pairs that have a real profile."""
    return list(_FILES)


@dataclass(frozen=True, slots=True)
class MlpProfile:
    """Median op times of one block, in seconds per layer, at sorted unique ``num_tokens``."""

    model: str
    gpu: str
    tp: int
    num_tokens: np.ndarray  # int64, strictly increasing
    ops: dict[str, np.ndarray]  # op name -> seconds (per layer; ``emb`` per model)

    @property
    def max_tokens(self) -> int:
        return int(self.num_tokens[-1])

    def layer_times(self) -> np.ndarray:
        """Summed per-layer time (all ops but ``emb``) at each profiled ``num_tokens``."""
        return np.sum([self.ops[op] for op in LAYER_OPS], axis=0)  # type: ignore[no-any-return]

    def layer_time(self, num_tokens: float) -> float:
        """Summed per-layer time at any token count, seconds.

        Linear interpolation between profiled points; below the first, the first
        value; beyond the last, linear extrapolation from the last point (see ``_interp``).
        """
        return _interp(self.num_tokens, self.layer_times(), num_tokens)

    def emb_time(self, num_tokens: float) -> float:
        """Embedding lookup (once per model, not per layer), seconds."""
        return _interp(self.num_tokens, self.ops["emb"], num_tokens)


def extrapolation_slope(xs: np.ndarray, ys: np.ndarray) -> float:
    """Slope for extrapolating beyond the last profiled point.

    The secant from the point nearest ``xs[-1] / 2`` to the last point: the
    slope of the last two points alone is dominated by measurement noise (it
    is negative for h100 Llama-2-7b at TP=1), while in the compute-bound tail
    the op times are close to linear in tokens.
    """
    k = int(np.searchsorted(xs, xs[-1] / 2))
    k = min(k, len(xs) - 2)
    return float((ys[-1] - ys[k]) / (xs[-1] - xs[k]))


def step_lookup(grid: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """``ys`` at the first profiled point at or above each of ``grid`` (within ``xs``' range).

    Tile quantisation (Sarathi-Serve §4.3): a GEMM of M rows costs as many output tiles as
    ``ceil(M / tile)``, so its time is flat inside a tile and jumps just past each tile
    boundary; the Vidur profiles show the jumps (llama-3-8b/a100, per layer: 412 us at 128
    tokens, 565 at 136; 609 at 256, 829 at 264). Profiled points are at least as dense as
    any tile (8 tokens apart up to 1024, at most 128 apart up to 16384), so the next
    profiled point lies in the same tile; linear interpolation would blend two tiles.
    Above the last point: ``ys[-1]`` (callers extrapolate).
    """
    idx = np.minimum(np.searchsorted(xs, grid, side="left"), len(xs) - 1)
    return ys[idx]  # type: ignore[no-any-return]


def _interp(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    if x > xs[-1]:
        return float(ys[-1] + extrapolation_slope(xs, ys) * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _canonical(model: str, gpu: str) -> tuple[str, str]:
    key = (model.lower(), _GPU_ALIASES.get(gpu.lower(), gpu.lower()))
    if key not in _FILES:
        raise ValueError(
            f"model/gpu: no profile for model {model!r} on gpu {gpu!r}; "
            f"available profiles: {available_profiles()}"
        )
    return key


def load_mlp_profile(model: str, gpu: str, tp: int = 1) -> MlpProfile:
    """Load the profile of ``model`` on ``gpu`` at TP degree ``tp`` (cached)."""
    return _load(*_canonical(model, gpu), tp)


@cache
def _load(model: str, gpu: str, tp: int) -> MlpProfile:
    raw = (resources.files("sloserve.data") / "profiles" / _FILES[(model, gpu)]).read_bytes()
    sums: dict[int, list[float]] = {}
    counts: dict[int, int] = {}
    with io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(raw)), encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if int(row["num_tensor_parallel_workers"]) != tp:
                continue
            n = int(row["num_tokens"])
            vals = [float(row[f"time_stats.{op}.median"]) for op in OPS]
            if n in sums:
                sums[n] = [a + b for a, b in zip(sums[n], vals, strict=True)]
                counts[n] += 1
            else:
                sums[n], counts[n] = vals, 1
    if not sums:
        raise ValueError(f"tp: profile {model!r}/{gpu!r} has no rows for tp={tp}; try 1, 2, 4 or 8")
    tokens = sorted(sums)
    table = np.array([[v / counts[n] * 1e-3 for v in sums[n]] for n in tokens])  # ms -> s
    ops = {op: table[:, i].copy() for i, op in enumerate(OPS)}
    return MlpProfile(model, gpu, tp, np.array(tokens, dtype=np.int64), ops)
