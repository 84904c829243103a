"""Executor backends: the seam between the executor service and what runs a batch.

``sim`` (docs/design.md, executors): no model; a batch lasts its ground-truth time
(``ProfileTiming``, real GPU profiles) and produces deterministic pseudo-tokens,
printable ASCII so the byte-level tokenizer turns them into text. ``torch``
lives in :mod:`sloserve.services.executor.torch_backend`, ``vllm`` in
:mod:`sloserve.services.executor.vllm_backend`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

from sloserve.batch import BatchSample, BatchShape
from sloserve.defaults import NOISE_CV
from sloserve.services.proto import common_pb2, executor_pb2

# The sim's tokens are a function of (request id, index): it has no distribution to
# sample from, so these fields change nothing (it says so in Info). It has no EOS either:
# it generates max_tokens unless a stop id or a stop string (the gateway's) ends it.
SIM_IGNORES = ("temperature", "top_p", "top_k", "seed")
PSEUDO_VOCAB = b"etaoinshrdlu etaoinsh cmfwypvbgkjqxz"  # letters by English frequency + spaces


@dataclass(slots=True)
class Step:
    tokens: dict[str, int]
    stopped: set[str] = field(default_factory=set)
    duration_s: float = 0.0  # sim: how long the batch must take; torch: how long it took
    realtime_wait: bool = False  # True: the service waits out duration_s
    kv_used_blocks: int = 0  # blocks in the batch's tables (backends that get tables)
    # request -> its token's logprobs, for requests whose Sampling.logprobs is set (vllm)
    logprobs: dict[str, common_pb2.TokenLogprobs] = field(default_factory=dict)


class Backend(Protocol):
    def describe(self) -> executor_pb2.ExecutorDescription: ...

    def reset(self) -> None:
        """A new scheduler stream: forget every sequence."""

    def execute(self, plan: executor_pb2.BatchPlan) -> Step: ...

    def warmup_samples(self) -> list[BatchSample]:
        """The startup profiling run: measured batches for the perf model's warm start."""
        ...


def plan_shape(plan: executor_pb2.BatchPlan) -> BatchShape:
    items = plan.items
    return BatchShape(
        prefills=tuple((i.num_tokens, i.context_len) for i in items if i.is_prefill),
        decodes=tuple(i.context_len for i in items if not i.is_prefill),
    )


def pseudo_token(request_id: str, index: int) -> int:
    """Deterministic token for (request, index): the same after a restart or recompute."""
    h = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=4).digest()
    return PSEUDO_VOCAB[int.from_bytes(h, "little") % len(PSEUDO_VOCAB)]


class SimBackend:
    """Ground-truth timing of ``model`` on ``gpu``; ``time_scale`` shrinks waits (benchmarks)."""

    def __init__(
        self,
        model: str,
        gpu: str,
        seed: int = 0,
        noise_cv: float = NOISE_CV,
        block_size: int = 16,
        num_blocks: int | None = None,
        time_scale: float = 1.0,
        fixed_batch_time: float | None = None,
        instance: int = 0,
    ) -> None:
        """Instance ``instance`` of a stack seeded ``seed`` draws its noise from the stream
        ``stream_seed(seed, instance)`` and profiles on the stack's shared stream, as
        ``simulate --noise-streams instance --noise-seed seed`` does."""
        from sloserve.perf.base import TimingSource
        from sloserve.perf.fixed import FixedTiming
        from sloserve.perf.ground_truth import ProfileTiming
        from sloserve.perf.hardware import get_hardware
        from sloserve.perf.memory import kv_capacity_blocks
        from sloserve.perf.models import get_model
        from sloserve.perf.noise import stream_seed

        if not time_scale >= 0:
            raise ValueError(f"time_scale: must be >= 0, got {time_scale}")
        if instance < 0:
            raise ValueError(f"instance (--instance): must be >= 0, got {instance}")
        self._sweep_timing: TimingSource
        self.timing: TimingSource
        if fixed_batch_time is not None:  # no noise, no stream
            self._sweep_timing = self.timing = FixedTiming(fixed_batch_time)
            self.noise_stream, self.noise_cv = "", 0.0
        else:
            truth = ProfileTiming(model, gpu, seed=seed, noise_cv=noise_cv)
            self.noise_stream, self.noise_cv = stream_seed(seed, instance), noise_cv
            self._sweep_timing, self.timing = truth, truth.with_noise_stream(self.noise_stream)
        self.shape = get_model(model)
        self.gpu = gpu
        self.seed = seed
        self.block_size = block_size
        self.num_blocks = num_blocks or kv_capacity_blocks(
            self.shape, get_hardware(gpu), block_size
        )
        self.time_scale = time_scale
        self._stop_ids: dict[str, frozenset[int]] = {}

    def describe(self) -> executor_pb2.ExecutorDescription:
        return executor_pb2.ExecutorDescription(
            model=self.shape.name, hardware=self.gpu, backend="sim",
            kv_capacity_blocks=self.num_blocks, block_size=self.block_size,
            max_context=self.shape.max_context, ignored_sampling=list(SIM_IGNORES),
            noise_stream=self.noise_stream, noise_cv=self.noise_cv,
        )

    def reset(self) -> None:
        self._stop_ids.clear()  # tokens are a function of (request id, index): no other state

    def execute(self, plan: executor_pb2.BatchPlan) -> Step:
        for rid in plan.freed:
            self._stop_ids.pop(rid, None)
        for seq in plan.added:
            if seq.sampling.stop_token_ids:
                self._stop_ids[seq.request_id] = frozenset(seq.sampling.stop_token_ids)
        tokens = {
            i.request_id: pseudo_token(i.request_id, i.token_index)
            for i in plan.items
            if i.samples_token
        }
        stopped = {r for r, t in tokens.items() if t in self._stop_ids.get(r, ())}
        duration = self.timing.batch_time(plan_shape(plan)) * self.time_scale
        return Step(tokens, stopped, duration_s=duration, realtime_wait=True)

    def warmup_samples(self) -> list[BatchSample]:
        from sloserve.perf.sweep import profile_sweep

        samples: list[BatchSample] = profile_sweep(self._sweep_timing, self.shape,
                                                   seed=self.seed)
        if self.time_scale != 1.0:  # what this executor's batches really take (as ``execute``)
            samples = [BatchSample(s.shape, s.duration * self.time_scale) for s in samples]
        return samples


SIM, TORCH, VLLM = "sim", "torch", "vllm"  # executor backends (vllm: the engine, not the policy)
BACKENDS = (SIM, TORCH, VLLM)


def make_backend(name: str, **kw: object) -> Backend:
    """``sim``, ``torch`` (needs torch) or ``vllm`` (needs a supported vLLM build).

    ``None`` values mean "the backend's default" (e.g. the block size: 16 for
    sim/torch, vLLM's for vllm)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    if name == SIM:
        allowed = ("model", "gpu", "seed", "noise_cv", "block_size", "num_blocks", "time_scale",
                   "fixed_batch_time", "instance")
        sim: Backend = SimBackend(**{k: v for k, v in kw.items() if k in allowed})  # type: ignore[arg-type]
        return sim
    if name == TORCH:
        from sloserve.services.executor.torch_backend import TorchBackend

        torch: Backend = TorchBackend(**kw)  # type: ignore[arg-type,unused-ignore]
        return torch
    if name == VLLM:
        from sloserve.services.executor.vllm_backend import VllmBackend

        vllm: Backend = VllmBackend(**kw)  # type: ignore[arg-type,unused-ignore]
        return vllm
    raise ValueError(f"backend: must be one of {BACKENDS}, got {name!r}")
