"""A vLLM-style profiling run: measure a grid of batch shapes before serving.

A scheduler never sees the timing function; it warm-starts its regression
(``AscendraRegression.fit``) from the samples measured here, as vLLM's
startup profiling run and Ascendra's offline fit do.
"""

from __future__ import annotations

import random

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.base import TimingSource
from sloserve.perf.models import ModelShape

_CHUNKS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
_PREFILL_CTX = (0, 512, 2048, 6144)
_DECODE_BATCH = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
_DECODE_CTX = (64, 256, 1024, 2048, 4096)
_MIXED_CHUNKS = (32, 128, 256, 512, 1024, 2048)
_MIXED_DECODES = (1, 4, 16, 32, 64, 128)


def profile_sweep(
    timing: TimingSource, model: ModelShape, max_tokens: int = 4096, seed: int = 0
) -> list[BatchSample]:
    """Measure prefill-only, decode-only and mixed batches up to ``max_tokens`` tokens.

    Contexts are capped at ``model.max_context`` and jittered (+-50%, seeded) so
    the samples are not all on one grid line. Returns ~200-400 samples.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
    rng = random.Random(seed)
    cap = model.max_context

    def ctx(mean: int, room: int) -> int:
        return max(0, min(int(mean * rng.uniform(0.5, 1.5)), cap - room))

    shapes: list[BatchShape] = []
    for c in (c for c in _CHUNKS if c <= min(max_tokens, cap)):
        for mean in _PREFILL_CTX:
            shapes.append(BatchShape(prefills=((c, ctx(mean, c)),)))
        if 2 * c <= max_tokens:
            shapes.append(BatchShape(prefills=((c, 0), (c, ctx(1024, c)))))
    for b in (b for b in _DECODE_BATCH if b <= max_tokens):
        for mean in _DECODE_CTX:
            for _ in range(2):
                shapes.append(BatchShape(decodes=tuple(ctx(mean, 1) for _ in range(b))))
    for c in _MIXED_CHUNKS:
        for b in (b for b in _MIXED_DECODES if c + b <= max_tokens):
            for mean in (256, 2048):
                decodes = tuple(ctx(mean, 1) for _ in range(b))
                shapes.append(BatchShape(prefills=((c, ctx(mean, c)),), decodes=decodes))
    return [BatchSample(s, timing.batch_time(s)) for s in shapes]
