"""Serving metrics and capacity criteria, exactly as docs/design.md "Measurements" defines them.

Times are seconds. Every percentile or share whose population is empty is
``None`` (JSON ``null``), never NaN, so a summary is always valid JSON.

* TTFT = first token time − arrival (requests that produced a token).
* TBT gaps = consecutive output-token gaps. ``tbt_p50/p90/p99`` pool all gaps
  of all requests (``tbt_token_p99`` is the same pooled P99 under its contract
  name); ``mean_tbt_p*`` are percentiles of each request's mean TBT.
* Goodput: a request is good if it FINISHED and meets every target it has —
  TTFT ≤ ``slo.ttft``, mean TBT ≤ ``slo.tbt`` (a 1-token request passes),
  and, for AccelGen's offline requests, JCT ≤ ``slo.jct``. Dropped, cancelled,
  offloaded-away and unfinished requests are misses. ``goodput_share`` = good /
  all; ``goodput_rps`` = good / duration.
* ``token_slo_attainment``: produced gaps within their request's TBT SLO.
* ``token_criterion_share`` (AccelGen's iteration-SLO attainment): every output
  token judged — the first against TTFT, each later one's gap against TBT —
  and every token a non-finished request did not produce (up to its
  ``output_len``) counted as a miss; targets a request lacks are skipped, except
  that a dropped or unfinished request's undelivered first token is always a miss
  (issue 38: dropping cannot meet the criterion).
* ``sched_delay_p50_all``: the median scheduling delay over *every* request, a
  dropped, shed or never-scheduled one counted as infinite (issue 38; the
  ``tail`` criterion's). An infinite median (half or more never scheduled) is
  ``None`` too: JSON has no infinity. ``drop_share`` = dropped / requests.
* duration = last finish − first arrival unless the caller passes it.
* Rates (issue 38, nothing hidden): ``offered_rps`` = (requests − 1) / (last arrival −
  first arrival), what the system was offered (after any trace rows too long for the
  context were removed; a command's ``qps`` is the nominal rate asked for);
  ``served_rps`` = completed / duration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any, Protocol

import numpy as np

from sloserve.request import Request, RequestStatus

Summary = dict[str, float | int | None]

CRITERIA = ("goodput", "tail", "token")
TAIL_SCHED_DELAY = 2.0  # seconds: Sarathi-Serve §5.1, median scheduling delay bound
MAX_DROP_SHARE = 0.01  # issue 38: the ``tail`` criterion fails a rate dropping more than this


def _share(hits: float, total: float) -> float | None:
    return float(hits) / total if total > 0 else None


def _slo_array(requests: Sequence[Request], kind: str) -> np.ndarray:
    return np.array(
        [np.nan if (v := getattr(r.slo, kind)) is None else v for r in requests], dtype=np.float64
    )


# counters summed exactly over chunks of requests (RunSummary)
_COUNTS = ("requests", "completed", "dropped", "good", "output_tokens", "gaps_on_time",
           "gaps_judged", "first_on_time", "criterion_total", "jct_hits", "jct_judged",
           "preemptions", "kept_scheduled")
# per-request or per-token values whose means and percentiles are reported;
# ``sched_delay_kept``: the delays of scheduled requests that were not dropped
# (the finite part of ``sched_delay_p50_all``)
DISTRIBUTIONS = ("ttft", "tbt", "mean_tbt", "sched_delay", "jct", "sched_delay_kept")


class Distribution(Protocol):
    """Values of one measurement: added in chunks, then a mean and percentiles."""

    def add(self, values: np.ndarray) -> None: ...
    def merge(self, other: Any) -> None: ...
    def mean(self) -> float | None: ...
    def percentiles(self, *qs: float) -> list[float | None]: ...


class ExactDistribution:
    """Every value kept: numpy's mean and linearly interpolated percentiles."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []

    def add(self, values: np.ndarray) -> None:
        self._parts.append(values)

    def merge(self, other: ExactDistribution) -> None:
        """Every value of ``other`` too, after this one's."""
        self._parts.extend(other._parts)

    def _values(self) -> np.ndarray:
        if len(self._parts) != 1:
            self._parts = [np.concatenate(self._parts) if self._parts else np.empty(0)]
        return self._parts[0]

    def mean(self) -> float | None:
        v = self._values()
        return float(v.mean()) if v.size else None

    def percentiles(self, *qs: float) -> list[float | None]:
        v = self._values()
        if v.size == 0:
            return [None] * len(qs)
        return [float(x) for x in np.percentile(v, qs)]


def _columns(requests: Sequence[Request]) -> tuple[dict[str, int], dict[str, np.ndarray],
                                                   tuple[float, float], float]:
    """One chunk of requests, measured (numpy over concatenated token times): its exact
    counters, its values per distribution, its first and last arrival and its last
    finish."""
    n = len(requests)
    counts = np.fromiter((len(r.token_times) for r in requests), dtype=np.int64, count=n)
    total = int(counts.sum())
    flat = np.fromiter(chain.from_iterable(r.token_times for r in requests), np.float64, total)
    arrival = np.fromiter((r.arrival_time for r in requests), np.float64, count=n)
    finished = np.fromiter((r.status is RequestStatus.FINISHED for r in requests), bool, count=n)
    dropped = int(sum(r.status is RequestStatus.DROPPED for r in requests))
    output_len = np.fromiter((r.output_len for r in requests), np.int64, count=n)
    ttft_slo, tbt_slo, jct_slo = (_slo_array(requests, k) for k in ("ttft", "tbt", "jct"))

    starts = np.cumsum(counts) - counts
    has_tok = counts > 0
    ttft = np.full(n, np.nan)
    ttft[has_tok] = flat[starts[has_tok]] - arrival[has_tok]
    multi = counts > 1
    mean_tbt = np.full(n, np.nan)
    last = flat[starts[multi] + counts[multi] - 1]
    mean_tbt[multi] = (last - flat[starts[multi]]) / (counts[multi] - 1)

    owner = np.repeat(np.arange(n), counts)  # request index of each token
    same = owner[1:] == owner[:-1]
    gaps = np.diff(flat)[same]
    gap_owner = owner[1:][same]

    finish = np.array(
        [
            r.finish_time
            if r.finish_time is not None
            else (r.token_times[-1] if r.token_times else np.nan)
            for r in requests
        ],
        dtype=np.float64,
    )
    jct = np.where(finished, finish - arrival, np.nan)

    with np.errstate(invalid="ignore"):
        ttft_ok = np.isnan(ttft_slo) | (ttft <= ttft_slo)
        tbt_ok = np.isnan(tbt_slo) | ~multi | (mean_tbt <= tbt_slo)
        jct_ok = np.isnan(jct_slo) | (jct <= jct_slo)
    good = int(np.count_nonzero(finished & ttft_ok & tbt_ok & jct_ok))

    # token-level attainment
    gap_slo = tbt_slo[gap_owner]
    judged = ~np.isnan(gap_slo)
    gaps_on_time = int(np.count_nonzero(gaps[judged] <= gap_slo[judged]))
    expected = np.where(finished, counts, np.maximum(output_len, counts))
    has_ttft, has_tbt = ~np.isnan(ttft_slo), ~np.isnan(tbt_slo)
    with np.errstate(invalid="ignore"):
        first_on_time = int(np.count_nonzero(has_ttft & has_tok & (ttft <= ttft_slo)))
    # a request that never delivered its first token (dropped, unfinished) is judged on it
    # even without a TTFT target: an undelivered first token is a miss (issue 38)
    first_judged = (has_ttft | ~has_tok) & (expected > 0)
    criterion_total = int(np.count_nonzero(first_judged)) + int(
        np.maximum(expected - 1, 0)[has_tbt].sum()
    )

    sched = np.array(
        [
            r.first_scheduled_time - r.arrival_time
            for r in requests
            if r.first_scheduled_time is not None
        ],
        dtype=np.float64,
    )
    kept = np.array(
        [
            r.first_scheduled_time - r.arrival_time
            for r in requests
            if r.first_scheduled_time is not None and r.status is not RequestStatus.DROPPED
        ],
        dtype=np.float64,
    )
    has_jct = ~np.isnan(jct_slo)
    with np.errstate(invalid="ignore"):
        jct_hits = int(np.count_nonzero(has_jct & finished & (jct <= jct_slo)))
    exact = {
        "requests": n, "completed": int(finished.sum()), "dropped": dropped, "good": good,
        "output_tokens": total, "gaps_on_time": gaps_on_time,
        "gaps_judged": int(judged.sum()), "first_on_time": first_on_time,
        "criterion_total": criterion_total, "jct_hits": jct_hits,
        "jct_judged": int(has_jct.sum()),
        "preemptions": sum(r.num_preemptions for r in requests),
        "kept_scheduled": int(kept.size),
    }
    values = {"ttft": ttft[has_tok], "tbt": gaps, "mean_tbt": mean_tbt[multi],
              "sched_delay": sched, "jct": jct[finished], "sched_delay_kept": kept}
    first_arrival = float(arrival.min()) if n else float("inf")
    last_finish = float(np.nanmax(finish[finished])) if finished.any() else float("-inf")
    last_arrival = float(arrival.max()) if n else float("-inf")
    return exact, values, (first_arrival, last_arrival), last_finish


def _median_with_infinite(finite: Distribution, num_finite: int, n: int) -> float | None:
    """The median of ``n`` values of which ``num_finite`` are ``finite``'s and the rest
    infinite (numpy's linear interpolation, the infinite ones last): the finite values'
    percentile at the median's position, or ``None`` once that position reaches the
    infinite ones (JSON has no infinity) or there are no values."""
    pos = (n - 1) / 2  # the median's index in the sorted n values
    if n == 0 or num_finite == 0 or math.ceil(pos) >= num_finite:
        return None
    if num_finite == 1:
        return finite.percentiles(50)[0]
    return finite.percentiles(min(100.0, 100 * pos / (num_finite - 1)))[0]


class RunSummary:
    """docs/design.md measurements accumulated over chunks of requests.

    Counts, shares, goodput and duration are exact in any chunking; each
    distribution is kept by ``distribution()``: every value (``summarize``) or a
    quantile sketch of constant size (``sloserve.sketch``).
    """

    def __init__(self, distribution: Callable[[], Distribution] = ExactDistribution) -> None:
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.dists = {k: distribution() for k in DISTRIBUTIONS}
        self.first_arrival = float("inf")
        self.last_arrival = float("-inf")
        self.last_finish = float("-inf")

    def add(self, requests: Sequence[Request]) -> None:
        """Fold ``requests`` (each in its final state) into the summary."""
        if not requests:
            return
        exact, values, (first, last_arrival), last = _columns(requests)
        for k, v in exact.items():
            self.counts[k] += v
        for k, arr in values.items():
            self.dists[k].add(arr)
        self.first_arrival = min(self.first_arrival, first)
        self.last_arrival = max(self.last_arrival, last_arrival)
        self.last_finish = max(self.last_finish, last)

    def merge(self, other: RunSummary) -> None:
        """Fold in another run part's summary (e.g. another worker's instances): counts
        add, distributions merge (``Distribution.merge``), the run's span covers both."""
        for k, v in other.counts.items():
            self.counts[k] += v
        for k, dist in other.dists.items():
            self.dists[k].merge(dist)
        self.first_arrival = min(self.first_arrival, other.first_arrival)
        self.last_arrival = max(self.last_arrival, other.last_arrival)
        self.last_finish = max(self.last_finish, other.last_finish)

    def result(
        self,
        *,
        duration: float | None = None,
        kv_utilization: float | None = None,
        preemptions: int | None = None,
        iterations: int | None = None,
    ) -> Summary:
        c, d = self.counts, self.dists
        n, completed, good, total = c["requests"], c["completed"], c["good"], c["output_tokens"]
        if duration is None and completed:
            duration = float(self.last_finish - self.first_arrival)
        rate_ok = duration is not None and duration > 0
        span = self.last_arrival - self.first_arrival
        ttft_p = d["ttft"].percentiles(50, 90, 99)
        tbt_p = d["tbt"].percentiles(50, 90, 99)
        mean_tbt_p = d["mean_tbt"].percentiles(50, 90, 99)
        sched_p = d["sched_delay"].percentiles(50, 99)
        sched_all = _median_with_infinite(d["sched_delay_kept"], c["kept_scheduled"], n)
        jct_p = d["jct"].percentiles(50, 99)
        return {
            "requests": n,
            "completed": completed,
            "dropped": c["dropped"],
            "drop_share": _share(c["dropped"], n),
            "unfinished": n - completed - c["dropped"],
            "good": good,
            "goodput_share": _share(good, n),
            "goodput_rps": good / duration if rate_ok else None,  # type: ignore[operator]
            "offered_rps": (n - 1) / span if n > 1 and span > 0 else None,
            "served_rps": completed / duration if rate_ok else None,  # type: ignore[operator]
            "duration": duration,
            "ttft_mean": d["ttft"].mean(),
            "ttft_p50": ttft_p[0],
            "ttft_p90": ttft_p[1],
            "ttft_p99": ttft_p[2],
            "tbt_mean": d["tbt"].mean(),
            "tbt_p50": tbt_p[0],
            "tbt_p90": tbt_p[1],
            "tbt_p99": tbt_p[2],
            "tbt_token_p99": tbt_p[2],
            "mean_tbt_p50": mean_tbt_p[0],
            "mean_tbt_p90": mean_tbt_p[1],
            "mean_tbt_p99": mean_tbt_p[2],
            "sched_delay_p50": sched_p[0],
            "sched_delay_p99": sched_p[1],
            "sched_delay_p50_all": sched_all,
            "jct_p50": jct_p[0],
            "jct_p99": jct_p[1],
            "token_slo_attainment": _share(c["gaps_on_time"], c["gaps_judged"]),
            "token_criterion_share": _share(c["first_on_time"] + c["gaps_on_time"],
                                            c["criterion_total"]),
            "jct_slo_attainment": _share(c["jct_hits"], c["jct_judged"]),
            "output_tokens": total,
            "throughput_tok_s": total / duration if rate_ok else None,  # type: ignore[operator]
            "preemptions": preemptions if preemptions is not None else c["preemptions"],
            "iterations": iterations,
            "kv_utilization": kv_utilization,
        }


def summarize(
    requests: Sequence[Request],
    *,
    duration: float | None = None,
    kv_utilization: float | None = None,
    preemptions: int | None = None,
    iterations: int | None = None,
) -> Summary:
    """All docs/design.md measurements for one run, every value kept (exact percentiles)."""
    acc = RunSummary()
    acc.add(requests)
    return acc.result(duration=duration, kv_utilization=kv_utilization,
                      preemptions=preemptions, iterations=iterations)


def check_criterion(criterion: str, tbt_slo: float | None = None,
                    max_drop_share: float = MAX_DROP_SHARE) -> None:
    """Raise ``ValueError`` unless ``criterion`` is known and has what it needs."""
    if criterion not in CRITERIA:
        raise ValueError(
            f"criterion (--criterion): must be one of {', '.join(CRITERIA)}, got {criterion!r}"
        )
    if criterion == "tail" and tbt_slo is None:
        raise ValueError("tbt_slo (--tbt-slo): required by the 'tail' criterion")
    if not (isinstance(max_drop_share, int | float) and not isinstance(max_drop_share, bool)
            and 0.0 <= max_drop_share <= 1.0):
        raise ValueError(f"max_drop_share (--max-drop-share): must be a share in [0, 1], "
                         f"got {max_drop_share!r}")


def _field(summary: Mapping[str, float | int | None], key: str) -> float | int | None:
    if key not in summary:
        raise ValueError(f"summary: has no {key!r} (judge a summary from "
                         f"sloserve.metrics.summarize or a simulation)")
    return summary[key]


def meets(
    summary: Mapping[str, float | int | None], criterion: str, target: float = 0.9,
    tbt_slo: float | None = None, max_drop_share: float = MAX_DROP_SHARE,
) -> bool:
    """Whether a run meets a capacity criterion: the one definition of each (issue 38),
    used by ``capacity``, ``compare`` and every experiment.

    ``goodput``: goodput_share ≥ target (a dropped request is a miss). ``token``:
    token_criterion_share ≥ target (a dropped request's undelivered first token, and
    every later one, is a miss). ``tail`` (Sarathi-Serve §5.1, drops counted): pooled
    P99 TBT ≤ ``tbt_slo``, the median scheduling delay over *every* request — a
    dropped, shed or never-scheduled one counted as infinite (``sched_delay_p50_all``)
    — ≤ 2 s, and ``drop_share`` ≤ ``max_drop_share`` (default 1 %); ``target`` unused;
    no gaps at all passes the P99 part.
    """
    check_criterion(criterion, tbt_slo, max_drop_share)
    if criterion == "tail":
        p99 = _field(summary, "tbt_token_p99")
        delay = _field(summary, "sched_delay_p50_all")
        dropped = _field(summary, "drop_share")
        assert tbt_slo is not None
        return ((p99 is None or p99 <= tbt_slo)
                and delay is not None and delay <= TAIL_SCHED_DELAY
                and dropped is not None and dropped <= max_drop_share)
    share = summary.get("goodput_share" if criterion == "goodput" else "token_criterion_share")
    return share is not None and share >= target


_SHARES = (
    "goodput_share",
    "drop_share",
    "token_slo_attainment",
    "token_criterion_share",
    "jct_slo_attainment",
    "kv_utilization",
)


def format_value(key: str, value: Any) -> str:
    """One summary value as ``format_table`` shows it: times in ms, shares in %."""
    if value is None:
        return "-"
    if key in _SHARES:
        return f"{100 * value:.1f} %"
    if key.startswith(("ttft", "tbt", "mean_tbt", "sched_delay")):
        return f"{1000 * value:.1f} ms"
    if key == "duration" or key.startswith("jct_p"):
        return f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:.2f}" + (
            " tok/s" if key == "throughput_tok_s" else " req/s" if key.endswith("rps") else "")
    return str(value)


def format_table(summary: Summary) -> str:
    """Human-readable two-column table: times in ms, shares in %, rates as is."""
    rows = [(key, format_value(key, value)) for key, value in summary.items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v:>14}" for k, v in rows)
