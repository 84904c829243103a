"""Ground-truth batch time of a simulated GPU (docs/design.md, executors: sim).

``t = overhead + linear(N) + lm_head(B) + attention + all_reduce``, times
multiplicative lognormal noise. N = tokens in the batch, B = sequences.

* linear: Vidur ``mlp.csv`` medians (real kernels: QKV, O, gate/up, down,
  norms, RoPE, SiLU, residual adds) summed per layer at N, x layers, + ``emb``.
  The profile medians are not monotone in N (dips up to 13%, measurement
  noise and kernel-selection artefacts); we take their running maximum, so
  the table is exact at every profiled point that is not in a dip. Between
  profiled points N costs what the next profiled point costs (``step_lookup``:
  GEMM tile quantisation, Sarathi-Serve §4.3; 256 -> 257 tokens +31%). Beyond
  the profile's last point: linear extrapolation (``extrapolation_slope``).
* lm_head: a (B x h) @ (h x V/T) GEMM, not in mlp.csv. Timed by the profile's
  own fused gate/up GEMM at the same M = B and K = h, scaled by N-ratio
  V / 2m: both GEMMs are weight-read bound at small B and compute bound at
  large B, and in both regimes time is linear in the N dimension.
* attention on A100 (``sarathi_calibrated``): causal pairs inside a chunk at
  the rate Sarathi-Serve's Fig. 2 prefill curve implies (~0.24 of peak), and
  each chunk's pairs over its cached context at the rate their Fig. 9 chunked
  prefills imply (~0.37 of peak); see ``sarathi_calibration``. Otherwise (H100):
* attention (the attention profiles are not public), per layer:
  - prefill chunk (c over l): causal FLOPs ``4 s n/T`` per query-key pair over
    ``c_pad * (l + (c+1)/2)`` pairs, c padded to FlashAttention's 128-row Q tile,
    at ``eff_max * K / (K + K_half)`` of peak, K = l + (c+1)/2 mean keys per
    query, and at most ``tiles / SMs`` occupancy for chunks too short to fill
    the GPU; floored by reading its KV at the decode bandwidth.
    FlashAttention-2 (Dao 2023, Fig. 4/7; causal, head dim 128) reaches about
    110/150/175/190 TFLOP/s on A100 at 512/1k/2k/4k tokens, i.e. 0.68 of peak
    with K_half ~ 224 keys; on H100 FA2 reaches ~330-350 TFLOP/s (0.35 of peak).
  - decode: KV cache read (+ one 16-token page per sequence for paging
    granularity and per-sequence reduction) at 75% of HBM bandwidth, the
    fraction paged/flash decode kernels sustain at long contexts.
  - a 4 us kernel-launch floor per attention kernel (prefill, decode) per layer.
* overhead: 1.5 ms per iteration + 8 us per sequence for scheduling, input
  preparation, sampling and detokenisation (vLLM-style CPU path). Assumed,
  not fitted: with it, a batch-1 llama-3-8b/a100 decode takes ~12 ms, in line
  with published vLLM batch-1 TPOT of 11-13 ms for 8B models on A100.
* all_reduce (TP > 1): two ring all-reduces of N x h activations per layer.
* noise: lognormal, mean 1, coefficient of variation ``noise_cv``, drawn
  from a ``random.Random(seed)``; ``noise_cv = 0`` gives the noiseless time.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sloserve.batch import BatchShape
from sloserve.defaults import NOISE_CV
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.noise import RunToRunNoise
from sloserve.perf.profiles import extrapolation_slope, load_mlp_profile, step_lookup
from sloserve.perf.sarathi_calibration import (
    causal_attention_efficiency,
    context_attention_efficiency,
)


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """Achievable attention rates on one GPU (see module docstring)."""

    num_sms: int
    prefill_eff_max: float  # fraction of peak FLOP/s for long causal prefills
    prefill_k_half: float = 224.0  # mean keys per query at half of eff_max
    decode_bw_eff: float = 0.75  # fraction of HBM bandwidth for KV reads
    q_tile: int = 128  # FlashAttention query-tile rows
    page_tokens: int = 16  # per-sequence KV read granularity
    launch: float = 4e-6  # seconds per kernel launch
    sarathi_calibrated: bool = False  # rates from Sarathi-Serve's A100 data (sarathi_calibration)


_KERNELS: dict[str, AttentionKernel] = {
    "a100": AttentionKernel(num_sms=108, prefill_eff_max=0.68, sarathi_calibrated=True),
    "h100": AttentionKernel(num_sms=132, prefill_eff_max=0.35),
}
ITERATION_OVERHEAD = 1.5e-3  # seconds per iteration (CPU: schedule, prepare, sample)
SEQUENCE_OVERHEAD = 8e-6  # seconds per sequence in the batch (sampling, detokenise)
ALL_REDUCE_LATENCY = 8e-6  # seconds per all-reduce call


class ProfileTiming:
    """``TimingSource`` for ``model`` on ``gpu`` from real Vidur profiles + attention roofline."""

    def __init__(
        self, model: str, gpu: str, seed: int = 0, noise_cv: float = NOISE_CV, tp: int = 1,
        *, calibrated: bool = True,
    ) -> None:
        """``calibrated=False``: the ground truth before the Sarathi calibration (linear
        interpolation between profiled points, FlashAttention-2's curve for every prefill
        pair), kept to measure what the calibration changes (docs/perf-models.md)."""
        if noise_cv < 0 or not math.isfinite(noise_cv):
            raise ValueError(f"noise_cv: must be a finite number >= 0, got {noise_cv!r}")
        profile = load_mlp_profile(model, gpu, tp)  # ValueError lists available profiles
        shape = get_model(profile.model)
        hw = get_hardware(profile.gpu)
        kern = _KERNELS[profile.gpu]
        self.model, self.gpu, self.tp, self.noise_cv = profile.model, profile.gpu, tp, noise_cv
        self._noise = RunToRunNoise(seed, noise_cv)
        L = shape.num_layers
        x = profile.num_tokens
        self._max = int(x[-1])
        lin = np.maximum.accumulate(profile.layer_times() * L + profile.ops["emb"])
        up = np.maximum.accumulate(
            profile.ops["mlp_up_proj"] * (shape.vocab_size / (2 * shape.intermediate_size))
        )
        grid = np.arange(self._max + 1, dtype=np.float64)
        between = step_lookup if calibrated else np.interp
        self._linear: list[float] = between(grid, x, lin).tolist()
        self._lm_head: list[float] = between(grid, x, up).tolist()
        self._linear_slope = extrapolation_slope(x, lin)
        self._lm_head_slope = extrapolation_slope(x, up)
        heads = shape.num_heads // tp
        dtype = shape.dtype_bytes
        kv_bytes = 2 * L * shape.kv_dim // tp * dtype  # per cached token, all layers
        self._q_tile = kern.q_tile
        self._tiles_full = kern.num_sms / heads  # Q tiles per head that fill every SM
        self._k_half = kern.prefill_k_half
        flops_per_pair = 4 * shape.head_dim * heads * L  # QK^T and PV, all layers
        self._calibrated = calibrated and kern.sarathi_calibrated
        if self._calibrated:  # Sarathi-Serve's measured rates (sarathi_calibration)
            self._pair_time = flops_per_pair / (hw.peak_flops * causal_attention_efficiency())
            self._ctx_pair_time = flops_per_pair / (hw.peak_flops * context_attention_efficiency())
        else:  # FlashAttention-2's published curve; cached context at the same rate
            self._pair_time = flops_per_pair / (hw.peak_flops * kern.prefill_eff_max)
            self._ctx_pair_time = 0.0
        self._ctx_time = kv_bytes / (hw.mem_bandwidth * kern.decode_bw_eff)
        self._page = kern.page_tokens
        self._launch = kern.launch * L
        self._ar_time = (
            0.0
            if tp == 1
            else 2 * L * 2 * (tp - 1) / tp * shape.hidden_size * dtype / hw.interconnect_bw
        )
        self._ar_fixed = 0.0 if tp == 1 else 2 * L * ALL_REDUCE_LATENCY

    def linear_time(self, num_tokens: int) -> float:
        """Linear layers, norms, RoPE, adds and embedding of a ``num_tokens`` batch, seconds."""
        if num_tokens <= self._max:
            return self._linear[num_tokens]
        return self._linear[-1] + self._linear_slope * (num_tokens - self._max)

    def lm_head_time(self, num_seqs: int) -> float:
        """LM-head GEMM over one token per sequence, seconds."""
        if num_seqs <= self._max:
            return self._lm_head[num_seqs]
        return self._lm_head[-1] + self._lm_head_slope * (num_seqs - self._max)

    def noiseless_time(self, shape: BatchShape) -> float:
        """The batch's time without run-to-run noise, seconds (0 for an empty batch)."""
        decodes = shape.decodes
        b_d = len(decodes)
        if not shape.prefills:
            return self.decode_time(b_d, sum(decodes)) if b_d else 0.0
        n = b_d
        seqs = b_d + len(shape.prefills)
        t = ITERATION_OVERHEAD + SEQUENCE_OVERHEAD * seqs
        tiles = 0
        pair_time = 0.0
        read_time = 0.0
        for c, ctx_i in shape.prefills:
            n += c
            c_tiles = -(-c // self._q_tile)
            tiles += c_tiles
            c_pad = c_tiles * self._q_tile
            if self._calibrated:  # in-chunk causal pairs + pairs over the cached context
                pair_time += c_pad * ((c + 1) * 0.5 * self._pair_time
                                      + ctx_i * self._ctx_pair_time)
            else:
                k = ctx_i + (c + 1) * 0.5  # mean keys per query
                pair_time += c_pad * (k + self._k_half) * self._pair_time
            read_time += (ctx_i + c) * self._ctx_time
        occupancy = min(1.0, tiles / self._tiles_full)
        t += max(pair_time / occupancy, read_time) + self._launch
        if b_d:
            t += (sum(decodes) + b_d * (1 + self._page)) * self._ctx_time + self._launch
        t += self.linear_time(n) + self.lm_head_time(seqs)
        if self._ar_fixed:
            t += self._ar_fixed + self._ar_time * n
        return t

    def decode_time(self, num_decodes: int, context_sum: int) -> float:
        """Noiseless time of a decode-only batch of ``num_decodes`` >= 1 sequences whose
        contexts sum to ``context_sum``: the decode-only case of ``noiseless_time``, which
        calls it (a decode-only batch's time depends on nothing else)."""
        fixed, pages, tables, ar = self._decode_terms(num_decodes)
        t = fixed + ((context_sum + pages) * self._ctx_time + self._launch) + tables
        return t + ar if self._ar_fixed else t

    def _decode_terms(self, num_decodes: int) -> tuple[float, int, float, float]:
        """The terms of ``decode_time`` that depend on the batch size alone: per-iteration
        and per-sequence overhead, the tokens read beyond the contexts (a page and the new
        token per sequence), linear + LM head, the all-reduce (TP > 1)."""
        n = num_decodes
        return (ITERATION_OVERHEAD + SEQUENCE_OVERHEAD * n, n * (1 + self._page),
                self.linear_time(n) + self.lm_head_time(n), self._ar_fixed + self._ar_time * n)

    def with_noise_stream(self, seed: int | str) -> ProfileTiming:
        """The same ground truth drawing its noise from its own stream seeded ``seed``
        (one per simulated instance: ``SimConfig.noise_streams``); tables are shared."""
        timing = copy.copy(self)
        timing._noise = RunToRunNoise(seed, self.noise_cv)
        return timing

    def batch_time(self, shape: BatchShape) -> float:
        """Measured duration of ``shape``: noiseless time x lognormal noise (mean 1)."""
        t = self.noiseless_time(shape)
        return self._noise.apply(t)

    def decode_batch_time(self, num_decodes: int, context_sum: int) -> float:
        """``batch_time`` of a decode-only batch from its size and context sum alone (the
        simulator's steady state, ``sim.steady``): the same time, the same noise draw."""
        return self._noise.apply(self.decode_time(num_decodes, context_sum))

    def decode_batch_times(self, num_decodes: int) -> Callable[[int], float]:
        """``decode_batch_time`` of ``num_decodes`` sequences as a function of the context
        sum alone, the terms that depend on the size computed once (a steady run's batches,
        ``sim.steady``, one per iteration): the same floats, the same noise draws."""
        fixed, pages, tables, ar = self._decode_terms(num_decodes)
        ctx_time, launch, noise = self._ctx_time, self._launch, self._noise.apply
        if not self._ar_fixed:
            return lambda context_sum: noise(
                fixed + ((context_sum + pages) * ctx_time + launch) + tables)
        return lambda context_sum: noise(
            fixed + ((context_sum + pages) * ctx_time + launch) + tables + ar)
