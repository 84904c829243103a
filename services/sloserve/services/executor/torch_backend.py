"""The ``torch`` backend: ``sloserve.model.engine.TorchEngine`` behind the executor seam.

The scheduler owns KV block allocation and sends each item's block table as a
delta (``BlockTables``: whole when new, then the blocks appended since);
the engine owns the tensors and token ids. A request joins the engine with
its prompt plus any tokens generated before a restart or offload (recompute).
"""

from __future__ import annotations

import threading

from sloserve.batch import BatchPlan, BatchSample, BatchShape, ScheduledItem
from sloserve.services.executor.backends import Step
from sloserve.services.executor.block_tables import BlockTables
from sloserve.services.proto import executor_pb2


class TorchBackend:
    def __init__(
        self,
        model: str,
        gpu: str = "cpu",
        seed: int = 0,
        block_size: int = 16,
        num_blocks: int | None = None,
        weights: str | None = None,
        dtype: str = "float32",
        **_: object,
    ) -> None:
        try:
            from sloserve.model.engine import TorchEngine
        except ImportError as exc:
            raise ValueError(
                f"backend: 'torch' needs torch and sloserve.model.engine ({exc}); use --backend sim"
            ) from exc
        device = "cpu" if gpu == "cpu" else "cuda"
        self.gpu = gpu
        self.engine = TorchEngine(
            model, weights=weights, device=device, dtype=dtype, num_blocks=num_blocks,
            block_size=block_size, seed=seed,
        )
        # Random-weight presets (tiny, ...) have no meaningful EOS: stopping on it would
        # cut benchmark outputs short at random, so they generate exactly max_tokens.
        self.ignore_eos = not self.engine.weights_loaded
        # The warm-up sweep (run in a thread at startup) writes KV into any block and
        # adds private sequences: plans wait for it rather than share the engine.
        self._engine_lock = threading.Lock()
        self.tables = BlockTables()  # rebuilt from the plans' deltas

    def describe(self) -> executor_pb2.ExecutorDescription:
        shape = self.engine.config.shape
        chat = self.engine.chat_template()
        return executor_pb2.ExecutorDescription(
            model=shape.name, hardware=self.gpu, backend="torch",
            kv_capacity_blocks=self.engine.num_blocks, block_size=self.engine.block_size,
            max_context=shape.max_context, tokenizer_json=self.engine.tokenizer_json(),
            chat_template=chat.template, bos_token=chat.bos_token, eos_token=chat.eos_token,
            eos_token_ids=[] if self.ignore_eos else list(self.engine.tokenizer.eos_token_ids),
        )

    def reset(self) -> None:
        with self._engine_lock:
            self.engine.reset()
            self.tables.reset()

    def execute(self, plan: executor_pb2.BatchPlan) -> Step:
        with self._engine_lock:
            return self._execute(plan)

    def _execute(self, plan: executor_pb2.BatchPlan) -> Step:
        from sloserve.model.sampling import SamplingParams

        tables = self.tables.apply(plan)  # the wire carries deltas
        for rid in plan.freed:
            self.engine.free(rid)
        for rid in plan.preempted:
            self.engine.preempted(rid)
        for seq in plan.added:
            self.engine.free(seq.request_id)
            left = seq.max_tokens - len(seq.generated_token_ids)
            s = seq.sampling
            self.engine.add_request(
                seq.request_id,
                [*seq.prompt_token_ids, *seq.generated_token_ids],
                SamplingParams(
                    temperature=s.temperature if s.HasField("temperature") else 1.0,
                    top_p=s.top_p if s.HasField("top_p") else 1.0,
                    top_k=s.top_k if s.HasField("top_k") else 0,
                    seed=s.seed if s.HasField("seed") else None,
                    max_tokens=max(1, left),
                    stop_token_ids=tuple(s.stop_token_ids),
                    ignore_eos=self.ignore_eos or s.ignore_eos,
                ),
            )
        added = {seq.request_id for seq in plan.added}
        for i in plan.items:  # a prefix-cache hit: its first chunk starts over cached blocks
            if i.context_len and i.request_id in added:
                self.engine.start_from_cache(i.request_id, i.context_len)
        core = BatchPlan(
            items=[
                ScheduledItem(i.request_id, i.num_tokens, i.context_len, i.is_prefill)
                for i in plan.items
            ]
        )
        res = self.engine.execute(core, tables)
        return Step(res.tokens, res.stopped, res.duration_s, realtime_wait=False,
                    kv_used_blocks=sum(len(t) for t in tables.values()))

    def warmup_samples(self) -> list[BatchSample]:
        """vLLM-style profiling run over the sweep's shapes that fit this engine's KV."""
        from sloserve.perf.sweep import profile_sweep

        engine = self.engine

        class _Timing:
            @staticmethod
            def batch_time(shape: BatchShape) -> float:
                try:
                    return float(engine.profile_batch(shape))
                except ValueError:  # more KV than this engine holds: not a sample
                    return 0.0

        with self._engine_lock:
            sweep = profile_sweep(_Timing(), engine.perf_shape, max_tokens=256)
        return [s for s in sweep if s.duration > 0]
