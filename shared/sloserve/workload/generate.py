"""Turn a length trace into timed requests with SLOs (``make_requests``).

Sampling (``sample``, issue 38): ``"random"`` draws ``num_requests`` rows at random
from the trace, without replacement when the trace is long enough and with
replacement otherwise; ``"ordered"`` takes ``num_requests`` consecutive rows in the
trace's own order from a seeded offset, so a conversation's turns (a session, or
a prefix identity that later rows extend) stay in order and together. The default
is ``"ordered"`` for a trace with session or prefix identity (``hash_ids``) and
``"random"`` otherwise. With ``arrival="trace"`` the first ``num_requests`` rows
are taken in order, with their own timestamps. Lengths, arrivals and SLOs use three independent RNG
streams spawned from ``seed``, so changing the SLO mix leaves lengths and
arrivals unchanged. Requests longer than ``max_context`` are removed and
counted; ids keep their position in the generated sequence (``r000042``), so a
request has the same id whatever the context limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sloserve.request import SLO, Request
from sloserve.workload.arrivals import gamma_arrivals, poisson_arrivals, trace_arrivals
from sloserve.workload.slo_mix import SLO_MIXES, BatchTime, hetero_slos, uniform_slos
from sloserve.workload.traces import TraceRequest

ARRIVALS = ("poisson", "gamma", "trace")
SAMPLES = ("random", "ordered")


def default_sample(lengths: Sequence[TraceRequest]) -> str:
    """``"ordered"`` for a trace with session or prefix identity, else ``"random"``."""
    keyed = any(r.hash_ids is not None or r.session is not None for r in lengths)
    return "ordered" if keyed else "random"


@dataclass(slots=True)
class Workload:
    requests: list[Request]
    num_too_long: int = 0  # removed: prompt_len + output_len > max_context
    info: dict[str, object] = field(default_factory=dict)


def make_requests(
    lengths: Sequence[TraceRequest],
    *,
    num_requests: int,
    qps: float | None,
    arrival: str = "poisson",
    cv: float = 1.0,
    seed: int = 0,
    ttft_slo: float | None = None,
    tbt_slo: float | None = None,
    jct_slo: float | None = None,
    slo_mix: str | None = None,
    jct_share: float = 0.0,
    batch_time: BatchTime | None = None,
    max_context: int | None = None,
    sample: str | None = None,
) -> Workload:
    """A deterministic workload for ``seed``.

    ``slo_mix``: ``None`` means ``uniform`` when any of ``ttft_slo``/``tbt_slo``/
    ``jct_slo`` is given and ``none`` otherwise. ``hetero`` is AccelGen's mix
    (see :mod:`sloserve.workload.slo_mix`; ``batch_time`` supplies the
    prompt-group latencies, ``jct_share`` the share of offline JCT requests).
    ``sample``: ``random`` | ``ordered`` (module docstring; ``None``: ``default_sample``).
    """
    mix = _check(lengths, num_requests, qps, arrival, ttft_slo, tbt_slo, jct_slo, slo_mix,
                 max_context, sample)
    len_rng, arr_rng, slo_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    rows, times, how, offset = _sample(lengths, num_requests, qps, arrival, cv, sample,
                                       len_rng, arr_rng)
    prompts = [r.prompt_len for r in rows]
    outputs = [r.output_len for r in rows]
    slos: list[SLO]
    if mix == "hetero":
        if jct_slo is not None:
            raise ValueError("jct_slo (--jct-slo): not used by --slo-mix hetero (use jct_share)")
        slos = hetero_slos(
            prompts,
            outputs,
            slo_rng,
            batch_time=batch_time,
            ttft_slo=ttft_slo,
            tbt_slo=tbt_slo,
            jct_share=jct_share,
        )
    else:
        slos = uniform_slos(num_requests, ttft_slo=ttft_slo, tbt_slo=tbt_slo, jct_slo=jct_slo)

    requests = [
        Request(f"r{i:06d}", float(times[i]), prompts[i], outputs[i], slo=slos[i],
                hash_ids=rows[i].hash_ids)
        for i in range(num_requests)
        if max_context is None or prompts[i] + outputs[i] <= max_context
    ]
    span = float(times[-1] - times[0])
    info: dict[str, object] = {
        "num_requests": len(requests),
        "num_too_long": num_requests - len(requests),
        "sample": how,
        "sample_offset": offset,
        "arrival": arrival,
        "qps": qps,
        "cv": cv if arrival == "gamma" else None,
        "offered_qps": (num_requests - 1) / span if span > 0 else None,
        "span_s": span,
        "seed": seed,
        "slo_mix": mix,
        "mean_prompt_len": float(np.mean([r.prompt_len for r in requests])) if requests else None,
        "mean_output_len": float(np.mean([r.output_len for r in requests])) if requests else None,
        "sampled_with_replacement": how == "random" and num_requests > len(lengths),
    }
    return Workload(requests, num_requests - len(requests), info)


def _check(lengths: Sequence[TraceRequest], num_requests: int, qps: float | None, arrival: str,
           ttft_slo: float | None, tbt_slo: float | None, jct_slo: float | None,
           slo_mix: str | None, max_context: int | None, sample: str | None) -> str:
    """``make_requests``' arguments, each refused naming its flag; the SLO mix resolved."""
    if not lengths:
        raise ValueError("trace (--trace): has no requests")
    if num_requests < 1:
        raise ValueError(f"num_requests (--num-requests): must be >= 1, got {num_requests}")
    if arrival not in ARRIVALS:
        raise ValueError(
            f"arrival (--arrival): must be one of {', '.join(ARRIVALS)}, got {arrival!r}"
        )
    if qps is not None and not (math.isfinite(qps) and qps > 0):
        raise ValueError(f"qps (--qps): must be a positive number of requests/s, got {qps!r}")
    if qps is None and arrival != "trace":
        raise ValueError(f"qps (--qps): required for --arrival {arrival}")
    if sample is not None and sample not in SAMPLES:
        raise ValueError(f"sample (--sample): must be one of {', '.join(SAMPLES)}, got {sample!r}")
    if arrival == "trace" and sample == "random":
        raise ValueError("sample (--sample): 'random' cannot keep --arrival trace's timestamps, "
                         "which need consecutive rows in order")
    if max_context is not None and max_context < 2:
        raise ValueError(f"max_context (--max-context): must be >= 2 tokens, got {max_context}")
    mix = slo_mix or ("uniform" if (ttft_slo, tbt_slo, jct_slo) != (None,) * 3 else "none")
    if mix not in SLO_MIXES:
        raise ValueError(f"slo_mix (--slo-mix): must be one of {', '.join(SLO_MIXES)}, got {mix!r}")
    if mix == "none" and (ttft_slo, tbt_slo, jct_slo) != (None,) * 3:
        raise ValueError(
            "slo_mix (--slo-mix): 'none' conflicts with a given --ttft/--tbt/--jct SLO"
        )
    return mix


def _sample(lengths: Sequence[TraceRequest], num_requests: int, qps: float | None,
            arrival: str, cv: float, sample: str | None, len_rng: np.random.Generator,
            arr_rng: np.random.Generator) -> tuple[list[TraceRequest], np.ndarray, str, int]:
    """The trace rows, their arrival times, how they were sampled and from which offset
    (module docstring: sampling)."""
    if arrival == "trace":
        if num_requests > len(lengths):
            raise ValueError(
                f"num_requests (--num-requests): --arrival trace needs consecutive rows, "
                f"but the trace has only {len(lengths)}"
            )
        rows = list(lengths[:num_requests])
        if any(r.arrival is None for r in rows):
            raise ValueError("arrival (--arrival): 'trace' needs a trace with arrival times")
        times = trace_arrivals([r.arrival for r in rows if r.arrival is not None], qps)
        return rows, times, "ordered", 0
    how, offset = sample or default_sample(lengths), 0
    if how == "ordered":
        if num_requests > len(lengths):
            raise ValueError(
                f"num_requests (--num-requests): --sample ordered takes consecutive rows in "
                f"the trace's order, but the trace has only {len(lengths)} (--sample random "
                f"draws with replacement)")
        offset = int(len_rng.integers(0, len(lengths) - num_requests + 1))
        rows = list(lengths[offset:offset + num_requests])
    else:
        idx = len_rng.choice(len(lengths), size=num_requests, replace=num_requests > len(lengths))
        rows = [lengths[i] for i in idx]
    assert qps is not None
    if arrival == "poisson":
        times = poisson_arrivals(num_requests, qps, arr_rng)
    else:
        times = gamma_arrivals(num_requests, qps, cv, arr_rng)
    return rows, times, how, offset
