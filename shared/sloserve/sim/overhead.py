"""The live stack's remaining service overhead, as part of the simulator's ground truth.

Issue 14, build item 4: ``simulate`` should predict ``up`` + ``bench``. The
simulated GPU's batch time comes from a ``TimingSource`` (the ground truth
of the *kernels*); what a live stack adds on top is time the executor sits
idle between two consecutive batches: the decision, the plan's and the
result's stream hops, applying the result. With overlap scheduling (vLLM's
async scheduling, SGLang's overlap scheduler; ``sloserve.driver``)
most of it is hidden behind the running batch and only the *un-hidden* gap
remains. The executor measures that gap itself for every batch
(``IterationResult.idle_before_s``) and the scheduler keeps a window of them
(``Status.unhidden_samples_s``).

An ``OverheadProfile`` is that empirical distribution, saved per backend (and
per policy: decision costs differ) as a small JSON file
(``sloserve bench --overhead-out FILE``, ``infra/bench/overhead.py --out``) and
loaded by ``simulate --overhead-profile FILE``. The simulator draws one gap per
back-to-back batch from it with the run's seed (``OverheadSampler``):
deterministic for a seed, uniform over the measured samples (a bootstrap of
the empirical distribution, no fitted shape). It is the *simulated executor's*
timing, never seen by a policy: the perf model the scheduler predicts with
learns batch times only, as the live perf model does from the executor's
measured durations, which exclude the gap.

A batch that starts on an idle instance (a request woke it) gets no gap: the
live executor's idle time before it is not overhead, and the scheduler leaves
it out of the window too.

A profile may also carry the gateway's *delivery lag* per token
(``delivery_s``: the gateway's emit time minus the end of the iteration that
produced the token, as ``bench`` sees it in ``GenerateChunk``): the scheduler's
hold, the stream hop and the gateway's emit, which a client's TTFT and TBT
include and a simulated token, timed at its iteration's end, does not. With
one, the simulator reports every token as delivered (``DeliverySampler``): each
request draws one lag from the samples and all its tokens arrive that much
later. One lag per request, not per token: the measured lag is correlated over
hundreds of milliseconds (autocorrelation 0.88-0.999 between consecutive tokens
on the stack, still 0.58-0.98 fifty tokens later under Ascendra), far longer than
a TBT, so independent draws per token would turn one slow stretch into a run of
zero gaps (measured: TBT P50 +22 to +167 %). It changes what is measured, not
what is scheduled.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "sloserve-overhead-profile"
VERSION = 1
DELIVERY_SAMPLES = 5000  # a run's tokens' delivery lags are subsampled to this many


def nearest_rank(samples: tuple[float, ...], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (``q`` in [0, 100])."""
    xs = sorted(samples)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


@dataclass(frozen=True, slots=True)
class OverheadProfile:
    """Measured un-hidden gaps between consecutive batches, seconds."""

    samples_s: tuple[float, ...]
    backend: str = "sim"
    policy: str = ""
    overlap: bool = True
    # free-form provenance: where and how it was measured (command, load average, …)
    source: dict[str, Any] = field(default_factory=dict)
    # tokens' gateway emit - iteration end (at most DELIVERY_SAMPLES of them); () none
    delivery_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.samples_s:
            raise ValueError("samples_s: the profile needs at least one measured gap")
        for name in ("samples_s", "delivery_s"):
            for k, x in enumerate(getattr(self, name)):
                if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
                    raise ValueError(f"{name}[{k}]: must be a finite number of seconds >= 0, "
                                     f"got {x!r}")

    @property
    def mean_s(self) -> float:
        return sum(self.samples_s) / len(self.samples_s)

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the gaps (``q`` in [0, 100])."""
        return nearest_rank(self.samples_s, q)

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT, "version": VERSION, "backend": self.backend,
            "policy": self.policy, "overlap": self.overlap, "source": self.source,
            "count": len(self.samples_s), "mean_s": self.mean_s,
            "p50_s": self.percentile(50), "p99_s": self.percentile(99),
            # nanoseconds: below perf_counter's meaning, and the file stays small
            "samples_s": [round(x, 9) for x in self.samples_s],
        }
        if self.delivery_s:  # microseconds: two wall clocks' difference
            out.update(delivery_p50_s=nearest_rank(self.delivery_s, 50),
                       delivery_p99_s=nearest_rank(self.delivery_s, 99),
                       delivery_s=[round(x, 6) for x in self.delivery_s])
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()) + "\n")

    @classmethod
    def from_json(cls, obj: Any, where: str = "overhead profile") -> OverheadProfile:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: must be a JSON object")
        if obj.get("format") != FORMAT:
            raise ValueError(f"{where}: format: must be {FORMAT!r}, got {obj.get('format')!r}")
        if obj.get("version") != VERSION:
            raise ValueError(f"{where}: version: must be {VERSION}, got {obj.get('version')!r}")
        samples = obj.get("samples_s")
        if not isinstance(samples, list):
            raise ValueError(f"{where}: samples_s: must be a list of seconds")
        source = obj.get("source", {})
        if not isinstance(source, dict):
            raise ValueError(f"{where}: source: must be a JSON object")
        delivery = obj.get("delivery_s", [])
        if not isinstance(delivery, list):
            raise ValueError(f"{where}: delivery_s: must be a list of seconds")
        try:
            return cls(tuple(samples), backend=str(obj.get("backend", "")),
                       policy=str(obj.get("policy", "")), overlap=bool(obj.get("overlap", True)),
                       source=source, delivery_s=tuple(delivery))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> OverheadProfile:
        try:
            obj = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"overhead_profile (--overhead-profile): cannot read {path}: "
                             f"{exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"overhead_profile (--overhead-profile): {path} is not JSON: "
                             f"{exc}") from None
        return cls.from_json(obj, f"overhead_profile (--overhead-profile) {path}")


class OverheadSampler:
    """One gap per back-to-back batch, drawn uniformly from the profile's samples with a
    generator of its own (seeded from the run's seed), so the ground truth's noise stream
    and the workload are the same with and without a profile."""

    def __init__(self, profile: OverheadProfile, seed: int) -> None:
        self._xs = profile.samples_s
        self._rng = random.Random(f"overhead:{seed}")

    def gap(self) -> float:
        return self._xs[int(self._rng.random() * len(self._xs))]


class DeliverySampler:
    """Each token's time as the gateway would deliver it: its iteration's end plus one lag
    per request, drawn from the profile's ``delivery_s`` with a generator of the request's
    own (the run's seed and its id), so the result does not depend on the order requests
    are measured in (``metrics`` modes, ``workers``)."""

    def __init__(self, profile: OverheadProfile, seed: int) -> None:
        assert profile.delivery_s
        self._xs = profile.delivery_s
        self._seed = seed

    def lag(self, request_id: str) -> float:
        rng = random.Random(f"delivery:{self._seed}:{request_id}")
        return self._xs[int(rng.random() * len(self._xs))]

    def delivered(self, request_id: str, token_times: list[float]) -> list[float]:
        d = self.lag(request_id)
        return [t + d for t in token_times]


class ControllerLag:
    """When each instance's report (its batch's tokens and its state) reaches the
    controller (``simulate --controller-lag``): live, both travel to the gateway in one
    scheduler output, which the gateway handles after the lag the profile measured
    (``delivery_s``); the controller frees an HP's ticket and counts its waiting prefills
    only then. One lag per report, drawn independently from a generator of its own. The
    measured lags already hold the gateway's queueing (live, an instance's reports arrive
    in order), so a later report may arrive first here: its state then stands, and the
    older state arriving after it is not applied (``newer``)."""

    def __init__(self, profile: OverheadProfile, seed: int, instances: int) -> None:
        assert profile.delivery_s
        self._xs = profile.delivery_s
        self._rng = random.Random(f"controller:{seed}")
        self._applied = [-1.0] * instances  # the time of the newest state applied

    def arrival(self, now: float) -> float:
        """When a report made at ``now`` reaches the controller."""
        return now + self._xs[int(self._rng.random() * len(self._xs))]

    def newer(self, k: int, made: float) -> bool:
        """Whether instance ``k``'s state made at ``made`` is newer than the one the
        controller holds (and, if so, it is held from now on)."""
        if made < self._applied[k]:
            return False
        self._applied[k] = made
        return True
