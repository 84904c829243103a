"""A constant-time ground truth: every batch takes ``seconds``, whatever its shape.

Not a GPU: a protocol-test clock. With it the simulator's timeline depends on
no profile and no noise, so the live stack (sim executor with
``--fixed-batch-time``) can be held to the simulator's decisions one for one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.batch import BatchShape


@dataclass(frozen=True, slots=True)
class FixedTiming:
    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"fixed_batch_time: must be > 0 seconds, got {self.seconds}")

    def batch_time(self, shape: BatchShape) -> float:
        return self.seconds
