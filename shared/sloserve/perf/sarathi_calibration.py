"""The ground truth's paged-context attention rate, derived from Sarathi-Serve's measurements.

Sarathi-Serve §4.3 and §5.4.1 (Fig. 14; its artifact's ``figure-9`` CSV): a chunk of a
prompt attends to the KV cache of every earlier chunk, read back through the paged cache.
Their data splits cleanly: a prompt of P tokens chunked at c costs the unchunked prefill
of each chunk alone (their ``figure-2`` prefill curve, same setup) plus the attention of
each chunk's queries over its cached context. The second term, divided into its FLOPs,
gives the rate that attention over cached context runs at; we express it as a fraction of
the GPU's peak so that the ground truth can use it for any model on the same GPU.

Setup of both files: Yi-34B (60 layers, 56 query heads of 128), TP=2 on A100 80GB
(312 TFLOP/s dense bf16 per GPU). Unit: ``figure-2`` in seconds, ``figure-9`` in ms.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

FIG2 = "sarathi-osdi24_figure2_prefill.csv"
FIG9 = "sarathi-osdi24_figure9_chunking_overhead.csv"
UNCHUNKED = 16384  # figure-9's chunk size meaning "no chunking"
#: Rows the rate is fitted on; 2047 and 4095 are held out to test it (tests/perf).
FIT_LENGTHS: tuple[int, ...] = (8191, 16383)


@dataclass(frozen=True, slots=True)
class SarathiSetup:
    """Yi-34B-200K at TP=2 on A100 80GB PCIe: the shapes behind the Sarathi CSVs."""

    num_layers: int = 60
    num_heads: int = 56
    head_dim: int = 128
    tp: int = 2
    peak_flops: float = 312e12  # per GPU

    @property
    def flops_per_pair(self) -> float:
        """Attention FLOPs per (query, key) pair on one GPU, all layers: QK^T and PV."""
        return 4.0 * self.head_dim * self.num_heads / self.tp * self.num_layers


YI34B_TP2 = SarathiSetup()


def _rows(name: str) -> list[dict[str, str]]:
    text = (resources.files("sloserve.data") / "profiles" / name).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


@cache
def prefill_curve() -> tuple[np.ndarray, np.ndarray]:
    """Figure 2: unchunked prefill time (s) against prompt tokens, as measured."""
    rows = sorted(_rows(FIG2), key=lambda r: int(r["batch_num_prefill_tokens"]))
    x = np.array([int(r["batch_num_prefill_tokens"]) for r in rows], dtype=np.float64)
    y = np.array([float(r["batch_execution_time"]) for r in rows])
    return x, y


@cache
def chunking_rows() -> tuple[tuple[int, int, float], ...]:
    """Figure 9: (prompt tokens, chunk size, full prefill time in seconds)."""
    return tuple((int(r["prefill_length"]), int(r["chunk_size"]),
                  float(r["prefill_execution_time"]) * 1e-3) for r in _rows(FIG9))


def chunks(prompt: int, chunk: int) -> list[tuple[int, int]]:
    """(chunk tokens, cached context) of each chunk of ``prompt`` at ``chunk`` tokens."""
    return [(min(chunk, prompt - s), s) for s in range(0, prompt, chunk)]


def context_pairs(prompt: int, chunk: int) -> int:
    """(query, cached key) pairs over all chunks: each chunk's queries times its context."""
    return sum(c * ctx for c, ctx in chunks(prompt, chunk))


def chunk_compute_time(prompt: int, chunk: int) -> float:
    """Each chunk timed as an unchunked prefill of its own length (figure 2), s."""
    x, y = prefill_curve()
    return float(sum(np.interp(c, x, y) for c, _ in chunks(prompt, chunk)))


@cache
def context_attention_efficiency(fit_lengths: tuple[int, ...] = FIT_LENGTHS) -> float:
    """Fraction of peak at which a chunk's attention over its cached context runs.

    Least squares through the origin of each chunked row's extra time (measured minus
    ``chunk_compute_time``) against its context FLOPs, over the rows of ``fit_lengths``:
    seconds per FLOP = sum(flops * extra) / sum(flops^2); eff = 1 / (that * peak).
    """
    s = YI34B_TP2
    fl, ex = [], []
    for prompt, chunk, measured in chunking_rows():
        if prompt not in fit_lengths or chunk >= UNCHUNKED:
            continue
        fl.append(context_pairs(prompt, chunk) * s.flops_per_pair)
        ex.append(measured - chunk_compute_time(prompt, chunk))
    f, e = np.array(fl), np.array(ex)
    if not len(f) or not (f @ e) > 0:
        raise ValueError(
            f"fit_lengths: no chunked rows with a positive context cost in {fit_lengths}")
    sec_per_flop = float(f @ e) / float(f @ f)
    return 1.0 / (sec_per_flop * s.peak_flops)


def predicted_chunked_time(prompt: int, chunk: int, eff: float) -> float:
    """Sarathi-setup prefill time of ``prompt`` chunked at ``chunk``, s, at context rate ``eff``."""
    s = YI34B_TP2
    ctx = context_pairs(prompt, chunk) * s.flops_per_pair / (eff * s.peak_flops)
    return chunk_compute_time(prompt, chunk) + ctx


@cache
def causal_attention_efficiency(min_tokens: int = 2048) -> float:
    """Fraction of peak at which an unchunked (causal, no cached context) prefill's attention runs.

    Figure 2's prefill times from ``min_tokens`` up, where the GEMMs are compute-bound and so
    linear in tokens, fitted by least squares as ``a * n + b * pairs(n)`` with
    ``pairs(n) = n^2 / 2`` causal (query, key) pairs: ``b`` is the time per pair.
    """
    x, y = prefill_curve()
    m = x >= min_tokens
    if m.sum() < 3:
        raise ValueError(f"min_tokens: figure 2 has fewer than 3 points from {min_tokens}")
    s = YI34B_TP2
    a = np.stack([x[m], x[m] ** 2 / 2 * s.flops_per_pair], axis=1)
    coef = np.linalg.lstsq(a, y[m], rcond=None)[0]
    return 1.0 / (float(coef[1]) * s.peak_flops)
