"""Analytic FLOPs (F) and HBM bytes (M) of one mixed batch (Ascendra App. A.2-A.4, eq. 6-9).

Notation of Ascendra's appendix: h hidden size, n query heads, s head size,
m FFN intermediate size, b FlashAttention block size; a batch has B_p prefill
chunks (c_i new tokens over l_i cached ones) and B_d decodes (context l^_i).
Per-GPU quantities under tensor parallelism T divide n, n_kv and m by T
(Ascendra A.1 note; BestServe tables 10-13). We extend the appendix where
it is silent or simplified, following BestServe's tables 1-2 and 8-9:

* FLOPs count 2 per multiply-add (Ascendra's tables count MACs; BestServe
  counts FLOPs) and bytes are elements x ``dtype_bytes``, so t_F = F/F_H and
  t_M = M/M_H are real roofline seconds.
* GQA: K/V projections and the KV cache use n_kv heads, not n.
* SwiGLU MLP: gate, up and down projections (3hm MACs per token, not 2hm).
* Causal attention: a chunk of c tokens over l cached ones has
  ``c*l + c*(c+1)/2`` query-key pairs; a decode over l^ has ``l^ + 1``.
* LM head: one sampled token per sequence in the batch (``B = B_p + B_d``).
* Weights are read once per iteration (Ascendra's 4h^2 + 2hm terms), plus
  norms and residual adds as activation traffic (BestServe tables 1, 6).
* FlashAttention re-reads (Ascendra eq. 8, ``3 c_i s l_i / b``) use the
  chunk's full key range ``l_i + c_i`` with b = ``FLASH_BLOCK``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sloserve.batch import BatchShape
from sloserve.perf.hardware import Hardware
from sloserve.perf.models import ModelShape

FLASH_BLOCK = 128  # b: FlashAttention KV block size (Ascendra A.1)


@dataclass(frozen=True, slots=True)
class AnalyticCost:
    """Per-iteration F and M of a batch for one (model, TP degree), constants precomputed."""

    flops_per_token: float  # linear layers, all layers (2 * MACs)
    flops_per_pair: float  # attention per query-key pair, all layers
    flops_per_seq: float  # LM head per sampled token
    weight_bytes: float  # read once per iteration
    act_bytes_per_token: float  # linear/norm/add activations + KV write + embedding row
    bytes_per_ctx: float  # KV cache read per cached token per sequence, all layers
    reread_bytes_per_pair: float  # FlashAttention Q/O re-reads per pair (eq. 8)
    bytes_per_seq: float  # LM head in/out + decode q/o per sequence

    @classmethod
    def of(cls, model: ModelShape, tp: int = 1) -> AnalyticCost:
        return _cost(model, tp)

    def flops_bytes(self, shape: BatchShape) -> tuple[float, float]:
        """(F, M) of ``shape`` on one GPU: FLOPs and HBM bytes."""
        prefill_pairs = 0.0
        tokens = 0
        for c, ctx_i in shape.prefills:
            p = c * ctx_i + c * (c + 1) * 0.5
            prefill_pairs += p
            tokens += c
        decodes = shape.decodes
        b_d = len(decodes)
        ctx = sum(decodes) + b_d  # sum_i (l^_i + 1)
        pairs = prefill_pairs + ctx
        tokens += b_d
        seqs = len(shape.prefills) + b_d
        # KV read: each chunk reads its earlier context and its own fresh KV once.
        kv_tokens = ctx + sum(c + ctx_i for c, ctx_i in shape.prefills)
        f = self.flops_per_token * tokens + self.flops_per_pair * pairs + self.flops_per_seq * seqs
        m = (
            self.weight_bytes
            + self.act_bytes_per_token * tokens
            + self.bytes_per_ctx * kv_tokens
            + self.reread_bytes_per_pair * prefill_pairs
            + self.bytes_per_seq * seqs
        )
        return f, m


@lru_cache(maxsize=64)
def _cost(model: ModelShape, tp: int) -> AnalyticCost:
    if tp < 1 or model.num_heads % tp or model.num_kv_heads % tp:
        raise ValueError(
            f"tp: {tp} must be >= 1 and divide num_heads={model.num_heads} "
            f"and num_kv_heads={model.num_kv_heads} of {model.name!r}"
        )
    h, L, V = model.hidden_size, model.num_layers, model.vocab_size
    q = h / tp  # n*s per GPU
    kv = model.kv_dim / tp  # n_kv*s per GPU
    m = model.intermediate_size / tp
    d = model.dtype_bytes
    # Linear MACs per token per layer: QKV h(q+2kv), O q*h, gate/up 2hm, down m*h.
    linear_macs = h * (q + 2 * kv) + q * h + 3 * h * m
    # Activation elements per token per layer (read input + write output, BestServe tab. 1/8):
    # QKV, O, gate/up, SiLU*gate (read 2m, write m), down, 2 RMSNorms, 2 residual adds,
    # plus the new token's K and V written to the cache.
    act = (h + q + 2 * kv) + (q + h) + (h + 2 * m) + 3 * m + (m + h) + 4 * h + 6 * h + 2 * kv
    # Attention per layer per (query, key) pair over n/T heads: QK^T and PV, 2 MACs * s each.
    pair_macs = 2 * q
    layer_weights = linear_macs + 2 * h  # + two RMSNorm weight vectors
    return AnalyticCost(
        flops_per_token=2.0 * L * linear_macs,
        flops_per_pair=2.0 * L * pair_macs,
        flops_per_seq=2.0 * h * V / tp,
        weight_bytes=float(d * (L * layer_weights + h * V / tp + h)),
        act_bytes_per_token=float(d * (L * act + 2 * h)),  # + embedding row read/write
        bytes_per_ctx=float(d * L * 2 * kv),
        reread_bytes_per_pair=float(d * L * 3 * q / FLASH_BLOCK),
        bytes_per_seq=float(d * (L * 2 * q + h + V / tp)),
    )


def batch_flops_bytes(model: ModelShape, shape: BatchShape, tp: int = 1) -> tuple[float, float]:
    """(F, M): FLOPs and HBM bytes of one iteration running ``shape`` on one of ``tp`` GPUs."""
    return _cost(model, tp).flops_bytes(shape)


def roofline_times(
    model: ModelShape, hw: Hardware, shape: BatchShape, tp: int = 1
) -> tuple[float, float]:
    """(t_M, t_F) = (M / M_H, F / F_H) in seconds (Ascendra eq. 4)."""
    f, m = _cost(model, tp).flops_bytes(shape)
    return m / hw.mem_bandwidth, f / hw.peak_flops
