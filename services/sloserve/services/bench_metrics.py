"""``vllm bench serve``'s metrics for ``sloserve bench`` (vLLM 0.32.0 ``benchmarks/serve.py``).

Computed from the measured token times of each request, with vLLM's names,
units (ms) and semantics, so a vLLM user reads the same numbers:

* a request succeeded if it FINISHED with at least one token; only those count
  (``completed``; the rest are ``failed``), as ``calculate_metrics``.
* TTFT = first token − send; E2EL (``latency``) = finish − send; ITL = every
  gap between consecutive tokens, pooled over requests.
* TPOT per request = (E2EL − TTFT) / (output tokens − 1) for > 1 output token.
  A 1-token request has no TPOT in the TPOT statistics, and counts as TPOT = 0
  for goodput (it always meets a TPOT target).
* ``--goodput ttft:MS tpot:MS e2el:MS``: a completed request is good when it
  meets every given target (value ≤ target); ``request_goodput`` = good /
  duration, ``null`` without ``--goodput``. Failed requests are never good.
* ``request_throughput`` = completed / duration; ``output_throughput``,
  ``total_token_throughput`` (and our ``input_throughput``) count the tokens of
  completed requests. An empty population's statistics are 0, as vLLM's
  ``np.mean(x or 0)``.

One difference, the duration: vLLM divides by the wall time of its sending
loop; we divide by ``summarize``'s duration (first arrival → last finish), so
every rate in one result shares one denominator (0 rates when none finished).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloserve.request import Request, RequestStatus

GOODPUT_NAMES = ("ttft", "tpot", "e2el")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = "99"


@dataclass(frozen=True, slots=True)
class Timing:
    """One request as ``vllm bench serve`` sees it (seconds; ``None`` when it failed)."""

    success: bool
    prompt_len: int
    output_len: int
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        """(E2EL − TTFT) / (n − 1); ``None`` for a failed or 1-token request."""
        if not self.success or self.output_len <= 1:
            return None
        assert self.latency is not None and self.ttft is not None
        return (self.latency - self.ttft) / (self.output_len - 1)


def timing(req: Request) -> Timing:
    """``req``'s measured times as a ``Timing`` (success: FINISHED with ≥ 1 token)."""
    times = req.token_times
    if req.status is not RequestStatus.FINISHED or not times:
        return Timing(False, req.prompt_len, len(times))
    end = req.finish_time if req.finish_time is not None else times[-1]
    return Timing(True, req.prompt_len, len(times), times[0] - req.arrival_time,
                  end - req.arrival_time, [b - a for a, b in zip(times, times[1:])])


def parse_goodput(pairs: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` → ``{"ttft": 500.0, "tpot": 50.0}`` (ms), each name once."""
    out: dict[str, float] = {}
    for pair in pairs or ():
        name, sep, value = pair.partition(":")
        try:
            ms = float(value) if sep else math.nan
        except ValueError:
            ms = math.nan
        if name not in GOODPUT_NAMES or not math.isfinite(ms):
            raise ValueError(f"goodput (--goodput): {pair!r} is not NAME:MS with NAME one of "
                             f"{', '.join(GOODPUT_NAMES)} and MS a number of milliseconds")
        if ms < 0:
            raise ValueError(f"goodput (--goodput): {pair!r}: the target must be >= 0 ms")
        if name in out:
            raise ValueError(f"goodput (--goodput): {name} given twice")
        out[name] = ms
    return out


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """``"ttft,tpot"`` → ``("ttft", "tpot")``; names from ``PERCENTILE_METRICS``."""
    names = tuple(n.strip() for n in text.split(","))
    bad = [n for n in names if n not in PERCENTILE_METRICS]
    if bad:
        raise ValueError(f"percentile_metrics (--percentile-metrics): unknown {bad[0]!r} "
                         f"(known: {', '.join(PERCENTILE_METRICS)})")
    return names


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` → ``(50.0, 90.0, 99.0)``; each in [0, 100]."""
    out = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            p = math.nan
        if not 0 <= p <= 100:
            raise ValueError(f"metric_percentiles (--metric-percentiles): {part.strip()!r} is "
                             "not a percentile in [0, 100]")
        out.append(p)
    return tuple(out)


def _ms(values: Iterable[float], name: str, percentiles: Sequence[float]) -> dict[str, float]:
    arr = np.fromiter(values, np.float64)
    if arr.size == 0:
        arr = np.zeros(1)  # vLLM: np.mean(values or 0)
    out = {f"mean_{name}_ms": float(arr.mean()) * 1000,
           f"median_{name}_ms": float(np.median(arr)) * 1000,
           f"std_{name}_ms": float(arr.std()) * 1000}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(arr, p)) * 1000
    return out


def is_good(t: Timing, goodput: Mapping[str, float]) -> bool:
    """Whether a request meets every ``--goodput`` target (ms); a failed one never does."""
    if not t.success:
        return False
    assert t.ttft is not None and t.latency is not None
    values = {"ttft": t.ttft, "tpot": t.tpot or 0.0, "e2el": t.latency}
    return all(values[k] <= ms / 1000 for k, ms in goodput.items())  # vLLM: slo_s >= value


def vllm_metrics(timings: Sequence[Timing], duration: float | None,
                 goodput: Mapping[str, float],
                 percentile_metrics: Sequence[str] = PERCENTILE_METRICS,
                 percentiles: Sequence[float] = (99.0,)) -> dict[str, Any]:
    """The scalar part of ``vllm bench serve``'s result JSON for one run."""
    ok = [t for t in timings if t.success]
    total_in = sum(t.prompt_len for t in ok)
    total_out = sum(t.output_len for t in ok)
    dur = duration if duration is not None and duration > 0 else math.inf  # none finished: 0/s
    good = sum(is_good(t, goodput) for t in ok)
    out: dict[str, Any] = {
        "failed": len(timings) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if goodput else None,
        "input_throughput": total_in / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
    }
    values: dict[str, Iterable[float]] = {
        "ttft": (t.ttft for t in ok if t.ttft is not None),
        "tpot": (p for t in ok if (p := t.tpot) is not None),
        "itl": (g for t in ok for g in t.itl),
        "e2el": (t.latency for t in ok if t.latency is not None),
    }
    for name in PERCENTILE_METRICS:
        if name in percentile_metrics:
            out.update(_ms(values[name], name, percentiles))
    return out


def per_request(timings: Sequence[Timing]) -> dict[str, list[Any]]:
    """vLLM's per-request arrays of the result file (seconds; ``None`` for a failed request)."""
    return {
        "input_lens": [t.prompt_len for t in timings],
        "output_lens": [t.output_len if t.success else 0 for t in timings],
        "ttfts": [t.ttft for t in timings],
        "itls": [t.itl for t in timings],
        "latencies": [t.latency for t in timings],
    }


PER_REQUEST_KEYS = frozenset(per_request([]))
VLLM_SCALARS = frozenset(vllm_metrics([], None, {}, ()))  # the keys without a unit suffix
