"""The sim executor's warm-up sweep times batches as its ``execute`` does."""

from __future__ import annotations

import pytest

from sloserve.services.executor.backends import SimBackend


def test_the_warmup_sweep_is_slowed_by_time_scale_like_every_executed_batch() -> None:
    base = SimBackend("llama-3-8b", "a100", noise_cv=0.0).warmup_samples()
    slow = SimBackend("llama-3-8b", "a100", noise_cv=0.0, time_scale=4.0).warmup_samples()
    assert [s.shape for s in slow] == [s.shape for s in base]
    assert [s.duration for s in slow] == pytest.approx([4.0 * s.duration for s in base])
