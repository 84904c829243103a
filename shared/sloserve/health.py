"""Hang detection: how long a batch may take before its executor counts as lost.

A batch that takes far longer than predicted is a hang (a stopped process, a wedged
GPU, a network partition that keepalive would notice only after tens of seconds).
The deadline is ``factor x predicted + slack_s``, where ``predicted`` is the perf
model's prediction for the batch *calibrated* by how the executor has really
compared with it lately (an EWMA of measured / predicted, never below 1): a perf
model that under-predicts a slow backend (a roofline before the first fit, a CPU
executor, ``--time-scale``) must not make every batch look hung. Defaults (2 x and
1 s) keep detection under the acceptance line of 3 x predicted + 1 s while leaving
a second for the scheduling stalls of a busy host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HANG_FACTOR = 2.0
HANG_SLACK_S = 1.0
CALIBRATION_WEIGHT = 0.1  # EWMA weight of the newest measured/predicted ratio
MAX_RATIO = 1000.0


@dataclass(slots=True)
class HangDeadline:
    """The deadline for one batch, learning the executor's pace from measured batches."""

    factor: float = HANG_FACTOR
    slack_s: float = HANG_SLACK_S
    ratio: float = field(default=1.0)  # EWMA of measured / predicted, >= 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"hang_factor: must be a finite number >= 1, got {self.factor!r}")
        if not (math.isfinite(self.slack_s) and self.slack_s > 0):
            raise ValueError(f"hang_slack_s: must be a finite number > 0, got {self.slack_s!r}")

    def expected(self, predicted_s: float) -> float:
        """The batch's time as this executor will likely take it."""
        return max(0.0, predicted_s) * self.ratio

    def deadline(self, predicted_s: float) -> float:
        """Seconds after the plan left by which its result must be back."""
        return self.factor * self.expected(predicted_s) + self.slack_s

    def widen(self) -> None:
        """A batch missed its deadline: double the expected pace, so an executor that is
        only much slower than predicted (a cold start, a compile) is not lost over and
        over; the batches that come back pull it down again."""
        self.ratio = min(MAX_RATIO, self.ratio * 2)

    def observe(self, predicted_s: float, measured_s: float) -> None:
        """A batch came back: follow the executor's pace relative to the perf model."""
        if predicted_s <= 0 or not math.isfinite(measured_s) or measured_s < 0:
            return
        r = min(MAX_RATIO, max(1.0, measured_s / predicted_s))
        self.ratio += CALIBRATION_WEIGHT * (r - self.ratio)
