"""Timing synthetic batches on the ``vllm`` backend (vLLM's profiling run, our shapes).

``profile_batch`` runs one batch of a ``BatchShape`` through
:class:`~sloserve.services.executor.vllm_backend.VllmEngine` exactly as a
plan would: private sequences of random token ids whose context counts as
already computed (its KV content does not change the time), blocks from a
private ``BlockManager``, every sequence sampling one greedy token. Used by
the executor's warm-up sweep and by ``sloserve profile --backend vllm``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sloserve.batch import BatchShape
from sloserve.kv import BlockManager
from sloserve.perf.models import ModelShape
from sloserve.services.proto import common_pb2, executor_pb2

if TYPE_CHECKING:
    from sloserve.services.executor.vllm_backend import VllmEngine

_PREFIX = "__profile_"


def perf_shape(model_dir: Path, name: str, dtype_bytes: int = 2) -> ModelShape:
    """The model's ``ModelShape`` (for perf models) from its HF ``config.json``."""
    from sloserve.model.config import from_hf_config

    raw = json.loads((model_dir / "config.json").read_text())
    return from_hf_config(raw, name).perf_shape(dtype_bytes)


WARMUP_SHAPES = 24


def warmup_shapes(engine: VllmEngine, seed: int = 0) -> list[BatchShape]:
    """About :data:`WARMUP_SHAPES` small shapes (<= 128 tokens, contexts <= 512) spread
    over ``sloserve profile``'s sweep: prefill-only, decode-only and mixed."""
    from sloserve.services.profile_cmd import sweep_shapes

    shapes = sweep_shapes(min(128, engine.runner.max_num_batched_tokens), 512, seed)
    step = max(1, len(shapes) // WARMUP_SHAPES)
    return shapes[::step]


def profile_batch(
    engine: VllmEngine, shape: BatchShape, clock: Callable[[], float] = time.perf_counter,
    seed: int = 0,
) -> float:
    """Run one synthetic batch of ``shape``; its duration in seconds of ``clock``."""
    work = [(c, ctx) for c, ctx in shape.prefills] + [(1, ctx) for ctx in shape.decodes]
    if not work:
        raise ValueError("shape: empty batch")
    kv = BlockManager(engine.num_blocks, engine.block_size)
    rng = random.Random(seed * 7919 + len(work))
    vocab = engine.runner.vocab_size
    greedy = common_pb2.Sampling(temperature=0.0, ignore_eos=True)
    plan = executor_pb2.BatchPlan()
    rids = []
    try:
        for i, (n, ctx) in enumerate(work):
            rid = f"{_PREFIX}{i}"
            if not kv.can_allocate(rid, ctx + n):
                raise ValueError(f"shape: needs more than the engine's {engine.num_blocks} "
                                 "KV blocks")
            kv.allocate(rid, ctx + n)
            ids = [rng.randrange(vocab) for _ in range(ctx + n)]
            engine.add(executor_pb2.NewSequence(request_id=rid, prompt_token_ids=ids,
                                                max_tokens=1, sampling=greedy))
            rids.append(rid)
            engine.assume_computed(rid, ctx)
            plan.items.add(request_id=rid, num_tokens=n, context_len=ctx, is_prefill=n > 1,
                           samples_token=True, block_table=kv.block_table(rid))
        start = clock()
        engine.execute(plan)
        return clock() - start
    finally:
        for rid in rids:
            engine.free(rid)
        engine.flush()


class VllmProfiled:
    """``sloserve profile --backend vllm``: the executor backend's engine, timed per shape."""

    def __init__(self, model: str, weights: str | None, dtype: str, seed: int,
                 threads: int | None, max_num_batched_tokens: int,
                 enforce_eager: bool = False) -> None:
        from sloserve.services.executor.vllm_backend import VllmBackend

        self.backend = VllmBackend(model, weights=weights, dtype=dtype, seed=seed,
                                   threads=threads, max_num_batched_tokens=max_num_batched_tokens,
                                   enforce_eager=enforce_eager)
        self.engine = self.backend.engine
        self.num_blocks, self.block_size = self.engine.num_blocks, self.engine.block_size
        self.weights_loaded = True
        self._shape = perf_shape(self.backend.model_dir, model, 4 if dtype == "float32" else 2)

    @property
    def perf_shape(self) -> ModelShape:
        return self._shape

    @property
    def name(self) -> str:
        return self._shape.name

    def profile_batch(self, shape: BatchShape, clock: Callable[[], float]) -> float:
        return profile_batch(self.engine, shape, clock)
