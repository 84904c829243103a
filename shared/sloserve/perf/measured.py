"""Ground truth from batches measured on a real device (``sloserve profile --out FILE``).

``MeasuredTiming`` is the ``TimingSource`` the simulator uses with
``--timing-profile``: a fit of the measured batch times, times the same
multiplicative lognormal noise (mean 1, ``noise_cv``) as ``ProfileTiming``.
The fit is linear in six per-batch work counts that mirror what the torch
executor does - a fixed per-iteration cost, one attention call per prefill
chunk, one LM-head row and sampling per sequence, linear layers per token,
causal query-key pairs of the chunks, and KV slots gathered - weighted by
1/t (relative error, as ``AscendraRegression``) and constrained to
non-negative coefficients so a bigger batch never predicts less time, also
beyond the measured range.

Samples file: a JSON object ``{"model", "device", "dtype", "hardware":
{name, peak_flops, mem_bandwidth, mem_bytes}, "samples": [{"prefills":
[[chunk, ctx], ...], "decodes": [ctx, ...], "duration": s}, ...]}``, or just
the ``samples`` list. ``from_file`` registers the recorded hardware (``cpu``)
so the regression's tM/tF use the measured peaks.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.batch import BatchSample, BatchShape
from sloserve.defaults import NOISE_CV
from sloserve.perf.hardware import Hardware, register_hardware
from sloserve.perf.noise import RunToRunNoise

FEATURES = ("iteration", "prefill_chunks", "sequences", "tokens", "prefill_pairs", "kv_slots")


def features(shape: BatchShape) -> list[float]:
    """Work counts of ``shape`` in the order of ``FEATURES``."""
    pairs = sum(c * ctx + c * (c + 1) / 2 for c, ctx in shape.prefills)
    kv = sum(c + ctx for c, ctx in shape.prefills) + sum(d + 1 for d in shape.decodes)
    return [1.0, float(len(shape.prefills)), float(shape.num_seqs), float(shape.num_tokens),
            float(pairs), float(kv)]


def _nnls_relative(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Least squares of ``x @ c ~ t`` in relative error with ``c >= 0`` (active set)."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    w = 1.0 / t
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], t * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


class MeasuredTiming:
    """``TimingSource`` fitted to measured ``BatchSample``s."""

    def __init__(
        self, samples: Sequence[BatchSample], seed: int = 0, noise_cv: float = NOISE_CV
    ) -> None:
        if noise_cv < 0 or not math.isfinite(noise_cv):
            raise ValueError(f"noise_cv: must be a finite number >= 0, got {noise_cv!r}")
        rows = [s for s in samples if not s.shape.is_empty and s.duration > 0]
        if len(rows) < len(FEATURES):
            raise ValueError(
                f"samples: need at least {len(FEATURES)} non-empty samples with positive "
                f"duration, got {len(rows)}"
            )
        x = np.array([features(s.shape) for s in rows])
        t = np.array([s.duration for s in rows])
        self.coefficients: tuple[float, ...] = tuple(_nnls_relative(x, t).tolist())
        self.noise_cv = noise_cv
        self._noise = RunToRunNoise(seed, noise_cv)

    @classmethod
    def from_file(cls, path: str | Path, seed: int = 0,
                  noise_cv: float = NOISE_CV) -> MeasuredTiming:
        samples, hardware, _ = load_samples(path)
        try:
            timing = cls(samples, seed=seed, noise_cv=noise_cv)
        except ValueError as e:
            raise ValueError(f"timing profile {path}: {e}") from None
        if hardware is not None:
            register_hardware(hardware)
        return timing

    def noiseless_time(self, shape: BatchShape) -> float:
        if shape.is_empty:
            return 0.0
        return float(np.dot(self.coefficients, features(shape)))

    def with_noise_stream(self, seed: int | str) -> MeasuredTiming:
        """The same ground truth drawing its noise from its own stream seeded ``seed``
        (one per simulated instance: ``SimConfig.noise_streams``); tables are shared."""
        timing = copy.copy(self)
        timing._noise = RunToRunNoise(seed, self.noise_cv)
        return timing

    def batch_time(self, shape: BatchShape) -> float:
        """Fitted time of ``shape`` x lognormal noise (mean 1, CV ``noise_cv``)."""
        t = self.noiseless_time(shape)
        return self._noise.apply(t)

    def mape(self, samples: Sequence[BatchSample]) -> float:
        errs = [abs(self.noiseless_time(s.shape) - s.duration) / s.duration
                for s in samples if s.duration > 0]
        if not errs:
            raise ValueError("samples: need at least one sample with a positive duration")
        return sum(errs) / len(errs)


# --- samples file ---------------------------------------------------------------------
def sample_to_json(s: BatchSample) -> dict[str, Any]:
    return {"prefills": [list(p) for p in s.shape.prefills], "decodes": list(s.shape.decodes),
            "duration": s.duration}


def save_samples(
    path: str | Path,
    samples: Sequence[BatchSample],
    hardware: Hardware | None = None,
    **meta: Any,
) -> None:
    doc: dict[str, Any] = dict(meta)
    if hardware is not None:
        doc["hardware"] = {"name": hardware.name, "peak_flops": hardware.peak_flops,
                           "mem_bandwidth": hardware.mem_bandwidth, "mem_bytes": hardware.mem_bytes}
    doc["samples"] = [sample_to_json(s) for s in samples]
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def load_samples(path: str | Path) -> tuple[list[BatchSample], Hardware | None, dict[str, Any]]:
    """(samples, recorded hardware or None, other metadata); ValueError names the file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"timing profile {path}: cannot read JSON samples ({e})") from None
    try:
        meta = doc if isinstance(doc, dict) else {}
        raw = doc["samples"] if isinstance(doc, dict) else doc
        samples = []
        for i, r in enumerate(raw):
            shape = BatchShape(
                prefills=tuple((int(c), int(ctx)) for c, ctx in r["prefills"]),
                decodes=tuple(int(d) for d in r["decodes"]),
            )
            duration = float(r["duration"])
            if not math.isfinite(duration) or duration < 0 or any(
                c < 1 or ctx < 0 for c, ctx in shape.prefills
            ) or any(d < 0 for d in shape.decodes):
                raise ValueError(f"sample {i} has a negative or non-finite value")
            samples.append(BatchSample(shape, duration))
        hw = meta.get("hardware")
        hardware = None if hw is None else Hardware(
            str(hw["name"]), float(hw["peak_flops"]), float(hw["mem_bandwidth"]),
            float(hw["mem_bytes"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"timing profile {path}: malformed samples file ({e!r})") from None
    if not samples:
        raise ValueError(f"timing profile {path}: no samples")
    extra = {k: v for k, v in meta.items() if k not in ("samples", "hardware")}
    return samples, hardware, extra
