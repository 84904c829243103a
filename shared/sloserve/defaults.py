"""Defaults every entry point shares: one definition each (issue 9, item 2).

SLOs are in seconds. ``simulate``, ``capacity``, ``bench``, ``up``, the gateway
and the policy configs all read them from here.
"""

from __future__ import annotations

MODEL = "llama-3-8b"  # the model every example, profile and figure uses
GPU = "a100"  # the GPU of the shipped profiles (Vidur's A100 sweeps)
NOISE_CV = 0.03  # run-to-run noise (CV) of the ground truth's batch times
TTFT_SLO = 1.0  # uniform TTFT SLO (Ascendra §8.1 uses 1 s for ShareGPT-sized prompts)
TBT_SLO = 0.15  # uniform TBT SLO: strict, as Sarathi-Serve §5's P99 TBT target for Llama-3-8B
READING_SPEED_TBT = 0.1875  # s/token, normal reading speed (AccelGen §1, §4.3)
HETERO_TBT_SLO = READING_SPEED_TBT  # the TBT anchor of AccelGen's heterogeneous mix (§6.1)
STRICT_TBT_SLO = 0.25  # below this a TBT SLO is "strict" (Sarathi-Serve §5)
STRICT_TOKEN_BUDGET = 512  # Sarathi-Serve §5: token budget under a strict TBT SLO
RELAXED_TOKEN_BUDGET = 2048  # Sarathi-Serve §5: token budget under a relaxed TBT SLO


def default_token_budget(tbt_slo: float | None, slo_mix: str | None) -> int:
    """Sarathi-Serve §5: 512 under a strict TBT SLO, 2048 under a relaxed one.

    No TBT SLO, or per-request SLOs (``slo_mix``), count as strict.
    """
    if tbt_slo is None or slo_mix is not None or tbt_slo < STRICT_TBT_SLO:
        return STRICT_TOKEN_BUDGET
    return RELAXED_TOKEN_BUDGET


def workload_slos(
    ttft_slo: float | None, tbt_slo: float | None, slo_mix: str | None
) -> tuple[float | None, float | None]:
    """The SLOs a workload gets when the user gave ``None`` for either.

    Uniform: ``TTFT_SLO``/``TBT_SLO``. Heterogeneous (AccelGen §6.1): no TTFT
    anchor (each group's measured latency is) and the reading-speed TBT anchor.
    """
    hetero = slo_mix is not None
    ttft = ttft_slo if ttft_slo is not None else (None if hetero else TTFT_SLO)
    tbt = tbt_slo if tbt_slo is not None else (HETERO_TBT_SLO if hetero else TBT_SLO)
    return ttft, tbt
