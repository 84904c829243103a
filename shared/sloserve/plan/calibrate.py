"""Fit the Estimator's hardware constants (§4.1's e_c/e_m, Table 3's dispatch times) to the
real GPU profiles we ship (``sloserve.perf.profiles``, Vidur ``mlp.csv``).

BestServe tuned ``e_c, e_m`` by aligning its simulator with benchmarks on Ascend
910B3 (§4.1) and measured per-module dispatch times there (Table 3). For a GPU we
do the same against per-layer profile times:

* data: every (model, TP, token count) row of every profile of the GPU, the
  measured per-layer time = the sum of the medians of the linear layers, norms,
  RoPE, activation and residual add (``LAYER_OPS``). The attention kernel and the
  all-reduce are not in the profiles, so the predicted time is Algorithm 1 over
  the same ops only: RMSNorm, Q/K/V/O projections + RoPE, RMSNorm, MLP, with no
  communication and no score terms;
* phases: decode efficiencies on rows of at most ``DECODE_MAX_TOKENS`` tokens
  (decode steps: one token per running request, vLLM's ``max_num_seqs`` = 256);
  prefill efficiencies on rows of at least ``PREFILL_MIN_TOKENS`` (prompt-sized
  batches); the three dispatch times are shared by both phases (a module's launch
  does not depend on the phase) and fitted on the decode rows, where they bind;
* objective: the mean absolute percentage error (MAPE); deterministic coordinate
  descent over fixed grids (efficiencies in steps of 0.0125, dispatch in steps of
  1 µs), from the paper's values.

``python -m sloserve.plan.calibrate a100`` prints the fit; ``presets.py`` holds the
result as literals (a test re-fits and compares).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from sloserve.perf.hardware import Hardware, get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.profiles import available_profiles, load_mlp_profile
from sloserve.plan.estimator import Efficiency, Estimator, EstimatorConfig

DECODE_MAX_TOKENS = 256
PREFILL_MIN_TOKENS = 128
TP_SIZES = (1, 2, 4, 8)
EFF_GRID = np.round(np.arange(0.05, 1.0 + 1e-9, 0.0125), 4)
DISPATCH_GRID = np.round(np.arange(0.0, 0.300e-3 + 1e-12, 1e-6), 9)
ROUNDS = 6
MODULES = ("rmsnorm", "attention", "rmsnorm", "mlp")


@dataclass(frozen=True)
class ProfileRows:
    """Per row: measured seconds, and per module the work ``W`` and traffic ``Q`` of its ops
    (arrays ``[rows, ops]``, ``W = 0`` for ops with no work)."""

    hw: Hardware
    labels: list[tuple[str, int]]  # (model, tp) per row
    tokens: np.ndarray
    measured: np.ndarray
    work: tuple[np.ndarray, ...]  # one [rows, ops] array per module of MODULES
    traffic: tuple[np.ndarray, ...]

    def subset(self, mask: np.ndarray) -> ProfileRows:
        return ProfileRows(self.hw, [lab for lab, m in zip(self.labels, mask, strict=True) if m],
                           self.tokens[mask], self.measured[mask],
                           tuple(w[mask] for w in self.work),
                           tuple(q[mask] for q in self.traffic))


def profile_rows(gpu: str) -> ProfileRows:
    """Every profiled (model, TP, token count) of ``gpu`` with its Estimator ops."""
    hw = get_hardware(gpu)
    pairs = [m for m, g in available_profiles() if g == hw.name]
    if not pairs:
        raise ValueError(f"gpu: no profile for {gpu!r}; profiled: {sorted(available_profiles())}")
    labels: list[tuple[str, int]] = []
    tokens: list[int] = []
    measured: list[float] = []
    per_mod: list[list[list[tuple[float, float]]]] = [[] for _ in MODULES]
    for name in pairs:
        model = get_model(name)
        for tp in TP_SIZES:
            try:
                prof = load_mlp_profile(name, gpu, tp)
            except ValueError:
                continue
            est = Estimator(model, hw, tp)
            for n, t in zip(prof.num_tokens, prof.layer_times(), strict=True):
                labels.append((name, tp))
                tokens.append(int(n))
                measured.append(float(t))
                for k, ops in enumerate(_module_ops(est, float(n))):
                    per_mod[k].append(ops)
    work = tuple(np.array([[w for w, _ in row] for row in mod]) for mod in per_mod)
    traffic = tuple(np.array([[q for _, q in row] for row in mod]) for mod in per_mod)
    return ProfileRows(hw, labels, np.array(tokens), np.array(measured), work, traffic)


def _module_ops(est: Estimator, n: float) -> list[list[tuple[float, float]]]:
    """(W, Q) of the profiled ops of the four modules for ``n`` tokens (no attention kernel)."""
    from sloserve.plan.estimator import attention_prefill_ops, mlp_ops, rmsnorm_ops

    m, t = est.model, est.tp
    norm = [(op.work or 0.0, op.traffic) for op in rmsnorm_ops(n, m.hidden_size)]
    attn = [(op.work or 0.0, op.traffic) for op in attention_prefill_ops(m, n, 0.0, t)
            if op.name in ("q_proj", "k_proj", "v_proj", "rope", "o_proj")]
    mlp = [(op.work or 0.0, op.traffic) for op in mlp_ops(m, n, t)]
    return [norm, attn, norm, mlp]


def predict(rows: ProfileRows, eff: Efficiency, dispatch: tuple[float, float, float]
            ) -> np.ndarray:
    """Algorithm 1 per row (one block, no communication) with roofline op times (eq. 5)."""
    c_rate, m_rate = eff.e_c * rows.hw.peak_flops, eff.e_m * rows.hw.mem_bandwidth
    d = {"rmsnorm": dispatch[0], "attention": dispatch[1], "mlp": dispatch[2]}
    t_dispatch = np.zeros(len(rows.measured))
    t_compute = np.zeros(len(rows.measured))
    for name, w, q in zip(MODULES, rows.work, rows.traffic, strict=True):
        compute = np.where(w > 0, np.maximum(w / c_rate, q / m_rate), 0.0).sum(axis=1)
        t_dispatch = t_dispatch + d[name]
        t_compute = np.maximum(t_dispatch, t_compute) + compute
    return t_compute


def mape(rows: ProfileRows, eff: Efficiency, dispatch: tuple[float, float, float]) -> float:
    pred = predict(rows, eff, dispatch)
    return float(np.mean(np.abs(pred - rows.measured) / rows.measured) * 100)


@dataclass(frozen=True)
class Calibration:
    gpu: str
    prefill: Efficiency
    decode: Efficiency
    dispatch: tuple[float, float, float]  # rmsnorm, attention, mlp (s)
    mape_prefill: float
    mape_decode: float
    rows_prefill: int
    rows_decode: int

    def config(self, e_plus: tuple[float, float], allreduce_floor: float) -> EstimatorConfig:
        p, d = self.prefill, self.decode
        return EstimatorConfig(
            prefill=Efficiency(p.e_c, p.e_m, e_plus[0]), decode=Efficiency(d.e_c, d.e_m, e_plus[1]),
            dispatch_rmsnorm=self.dispatch[0], dispatch_attention=self.dispatch[1],
            dispatch_mlp=self.dispatch[2], allreduce_floor=allreduce_floor)


def _descend(rows: ProfileRows, params: list[float], free: list[int]) -> list[float]:
    """Coordinate descent on MAPE: params = [e_c, e_m, d_norm, d_attn, d_mlp]."""

    def loss(p: list[float]) -> float:
        return mape(rows, Efficiency(p[0], p[1], 1.0), (p[2], p[3], p[4]))

    best = loss(params)
    for _ in range(ROUNDS):
        improved = False
        for k in free:
            grid = EFF_GRID if k < 2 else DISPATCH_GRID
            for v in grid:
                trial = list(params)
                trial[k] = float(v)
                val = loss(trial)
                if val < best - 1e-9:
                    best, params, improved = val, trial, True
        if not improved:
            break
    return params


def calibrate(gpu: str) -> Calibration:
    """Fit ``e_c, e_m`` per phase and the three dispatch times to ``gpu``'s profiles."""
    rows = profile_rows(gpu)
    dec = rows.subset(rows.tokens <= DECODE_MAX_TOKENS)
    pre = rows.subset(rows.tokens >= PREFILL_MIN_TOKENS)
    paper = EstimatorConfig()
    start = [paper.decode.e_c, paper.decode.e_m, paper.dispatch_rmsnorm,
             paper.dispatch_attention, paper.dispatch_mlp]
    d = _descend(dec, start, [0, 1, 2, 3, 4])
    p = _descend(pre, [paper.prefill.e_c, paper.prefill.e_m, *d[2:]], [0, 1])
    dispatch = (d[2], d[3], d[4])
    e_pre, e_dec = Efficiency(p[0], p[1], 1.0), Efficiency(d[0], d[1], 1.0)
    return Calibration(gpu, e_pre, e_dec, dispatch, mape(pre, e_pre, dispatch),
                       mape(dec, e_dec, dispatch), len(pre.measured), len(dec.measured))


def main(argv: list[str] | None = None) -> int:
    for gpu in argv if argv is not None else sys.argv[1:] or ["a100", "h100"]:
        c = calibrate(gpu)
        print(f"{gpu}: prefill e_c={c.prefill.e_c} e_m={c.prefill.e_m} "
              f"(MAPE {c.mape_prefill:.1f} % over {c.rows_prefill} rows); decode "
              f"e_c={c.decode.e_c} e_m={c.decode.e_m} (MAPE {c.mape_decode:.1f} % over "
              f"{c.rows_decode} rows); dispatch rmsnorm/attention/mlp = "
              + "/".join(f"{v * 1e3:.3f}" for v in c.dispatch) + " ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
