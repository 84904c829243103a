"""A fixed linear batch-time model: ``t = base + per_token * tokens + per_ctx * context``.

Used as the cold-start model before any sample has been seen, and in tests
where a policy's behaviour must not depend on a fitted model.
"""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.batch import BatchShape


@dataclass(frozen=True, slots=True)
class LinearPerfModel:
    base: float = 0.010  # seconds per iteration
    per_token: float = 0.0002  # seconds per new token (prefill or decode)
    per_ctx: float = 1e-7  # seconds per cached token read by attention

    def predict(self, shape: BatchShape) -> float:
        ctx = sum(c for _, c in shape.prefills) + sum(shape.decodes)
        return self.base + self.per_token * shape.num_tokens + self.per_ctx * ctx
