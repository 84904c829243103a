"""The ``vllm`` backend: vLLM's own model runner executes our scheduler's plans.

Our scheduler decides every iteration and owns every KV block; each
``BatchPlan`` (added sequences, chunk sizes, block tables, preemptions,
frees) becomes one forward pass of vLLM's worker over vLLM's KV cache at the
block ids our ``BlockManager`` assigned, sampled by vLLM's sampler (docs/design.md,
executors). vLLM's internal types stay in :mod:`.vllm_adapter`.

Contract (as the ``torch`` backend, ``docs/torch-executor.md``): an item runs
``num_tokens`` tokens from ``context_len``, which must equal what this
backend has computed for the request; the block table must cover
``context_len + num_tokens`` with ids in ``[0, kv_capacity_blocks)``; a bad
plan raises ``ValueError`` naming the request before anything runs. A request
joins (``added``) with its prompt plus any tokens generated before a
restart; after ``preempted`` it keeps its tokens and its next item recomputes
them from context 0 (vLLM's recompute preemption). Stopping is ours: a stop id, EOS (unless
``ignore_eos``), or ``max_tokens`` output tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sloserve.batch import BatchSample
from sloserve.model.plan_check import check_plan
from sloserve.services.executor.backends import Step
from sloserve.services.executor.block_tables import BlockTables
from sloserve.services.executor.vllm_adapter import (
    CachedSeq,
    NewSeq,
    Sampled,
    SeqSampling,
    VllmRunner,
)
from sloserve.services.proto import common_pb2, executor_pb2


@dataclass(slots=True)
class _Seq:
    token_ids: list[int]
    prompt_len: int  # the original prompt (output tokens = the rest)
    max_tokens: int  # output tokens in all, including those generated before a re-add
    sampling: SeqSampling
    stop_ids: frozenset[int]
    min_tokens: int = 0  # a stop id ends it only after this many output tokens
    num_computed: int = 0
    in_runner: bool = False
    runner_blocks: list[int] = field(default_factory=list)  # the table vLLM holds
    runner_outputs: int = 0  # tokens vLLM sampled for it (its output_token_ids)
    resume: bool = False  # preempted while in the runner: send the whole new table


def sampling_of(s: common_pb2.Sampling, stop_ids: frozenset[int] = frozenset()) -> SeqSampling:
    """The wire's ``Sampling`` with vLLM's defaults for unset fields; ``stop_ids``: the
    tokens that end the request (EOS unless ignore_eos, stop ids)."""
    temperature = s.temperature if s.HasField("temperature") else 1.0
    top_p = s.top_p if s.HasField("top_p") else 1.0
    top_k = s.top_k if s.HasField("top_k") else 0
    if temperature < 0:
        raise ValueError(f"sampling.temperature: must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"sampling.top_p: must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"sampling.top_k: must be >= 0 (0 disables), got {top_k}")
    def opt(name: str, default: float) -> float:
        return float(getattr(s, name)) if s.HasField(name) else default  # type: ignore[arg-type]

    return SeqSampling(
        temperature, top_p, top_k, s.seed if s.HasField("seed") else None,
        presence_penalty=opt("presence_penalty", 0.0),
        frequency_penalty=opt("frequency_penalty", 0.0),
        repetition_penalty=opt("repetition_penalty", 1.0), min_p=opt("min_p", 0.0),
        min_tokens=max(0, s.min_tokens),
        logprobs=s.logprobs if s.HasField("logprobs") else None,
        structured_outputs=s.structured_outputs, stop_ids=tuple(sorted(stop_ids)))


def logprobs_proto(t: Sampled) -> common_pb2.TokenLogprobs | None:
    """The wire's ``TokenLogprobs`` of a sampled token, None when none were asked for."""
    if t.logprob is None:
        return None
    return common_pb2.TokenLogprobs(
        logprob=t.logprob, rank=t.rank, top_token_ids=[i for i, _ in t.top],
        top_logprobs=[v for _, v in t.top])


class VllmEngine:
    """Sequence bookkeeping between our plans and :class:`VllmRunner` (no gRPC)."""

    def __init__(self, runner: VllmRunner) -> None:
        self.runner = runner
        self._seqs: dict[str, _Seq] = {}
        self._drop: set[str] = set()  # the runner still holds these: finish them next step
        self.tables = BlockTables()  # rebuilt from the plans' deltas (issue 14)

    @property
    def num_blocks(self) -> int:
        return self.runner.num_blocks

    @property
    def block_size(self) -> int:
        return self.runner.block_size

    def reset(self) -> None:
        self._drop |= {r for r, s in self._seqs.items() if s.in_runner}
        self._seqs.clear()
        self.tables.reset()

    def free(self, rid: str) -> None:
        seq = self._seqs.pop(rid, None)
        if seq is not None and seq.in_runner:
            self._drop.add(rid)

    def add(self, new: executor_pb2.NewSequence) -> None:
        rid = new.request_id
        self.free(rid)  # a re-add (after preemption) starts over: recompute
        tokens = [*new.prompt_token_ids, *new.generated_token_ids]
        if not new.prompt_token_ids:
            raise ValueError(f"added {rid}: prompt_token_ids must not be empty")
        bad = [t for t in tokens if not 0 <= t < self.runner.vocab_size]
        if bad:
            raise ValueError(f"added {rid}: token ids {bad[:3]} outside vocab "
                             f"[0, {self.runner.vocab_size})")
        if len(new.prompt_token_ids) + new.max_tokens > self.runner.max_model_len:
            raise ValueError(f"added {rid}: prompt ({len(new.prompt_token_ids)}) + max_tokens "
                             f"({new.max_tokens}) exceeds the model context "
                             f"{self.runner.max_model_len}")
        s = new.sampling
        stop = set(s.stop_token_ids)
        if not s.ignore_eos:
            stop |= set(self.runner.eos_token_ids)
        stop_ids = frozenset(stop)
        self._seqs[rid] = _Seq(tokens, len(new.prompt_token_ids), max(1, new.max_tokens),
                               sampling_of(s, stop_ids), stop_ids, max(0, s.min_tokens))

    def assume_computed(self, rid: str, num_tokens: int) -> None:
        """Count the first ``num_tokens`` as already in the KV cache: profiling, and a
        prefix-cache hit (the scheduler's cached blocks head the sequence's table)."""
        seq = self._seqs[rid]
        if seq.in_runner or not 0 <= num_tokens < len(seq.token_ids):
            raise ValueError(f"assume_computed {rid}: {num_tokens} not in [0, "
                             f"{len(seq.token_ids)}) or already running")
        seq.num_computed = num_tokens

    def flush(self) -> None:
        """Let the runner forget dropped sequences now rather than with the next plan."""
        if self._drop:
            drop, self._drop = self._drop, set()
            self.runner.step([], [], {}, drop)

    def preempted(self, rid: str) -> None:
        """Recompute (vLLM's preemption): the KV is gone, the tokens stay; the next item
        recomputes them from context 0 and vLLM resumes the request with a new block table
        (its sampler state, e.g. a seeded generator, carries on)."""
        seq = self._seqs.get(rid)
        if seq is None:
            raise ValueError(f"preempted: unknown request {rid!r}")
        seq.num_computed = 0
        seq.resume = seq.in_runner

    def output_ids(self, rid: str) -> list[int]:
        seq = self._seqs[rid]
        return seq.token_ids[seq.prompt_len:]

    def _validate(self, items: list[executor_pb2.PlanItem],
                  tables: dict[str, list[int]]) -> None:
        check_plan([(i.request_id, i.context_len, i.num_tokens) for i in items], self._seqs,
                   tables, self.block_size,
                   self.num_blocks, self.runner.max_num_batched_tokens, self.runner.max_num_seqs)

    def _sampling_ids(self, items: list[executor_pb2.PlanItem]) -> list[str]:
        """The items that complete their sequence (sample a token), in the plan's order."""
        return [i.request_id for i in items
                if self._seqs[i.request_id].num_computed + i.num_tokens
                >= len(self._seqs[i.request_id].token_ids)]

    def execute(self, plan: executor_pb2.BatchPlan) -> Step:
        tables = self.tables.apply(plan)  # the wire carries deltas
        for rid in plan.freed:
            self.free(rid)
        for rid in plan.preempted:
            self.preempted(rid)
        for new in plan.added:
            self.add(new)
        items = list(plan.items)
        added = {new.request_id for new in plan.added}
        for it in items:  # a prefix-cache hit: the table's first blocks hold its KV already
            if it.context_len and it.request_id in added:
                self.assume_computed(it.request_id, it.context_len)
        self._validate(items, tables)
        if not items and not self._drop:
            return Step({}, duration_s=0.0)
        news: list[NewSeq] = []
        cached: list[CachedSeq] = []
        for it in items:
            seq = self._seqs[it.request_id]
            table = list(tables[it.request_id])  # a copy: ``tables`` grows in place
            if not seq.in_runner:
                news.append(NewSeq(it.request_id, seq.token_ids, seq.sampling, table,
                                   it.context_len, len(seq.token_ids) - seq.prompt_len))
            else:
                n = len(seq.runner_blocks)
                append = not seq.resume and table[:n] == seq.runner_blocks
                cached.append(CachedSeq(it.request_id, it.context_len,
                                        table[n:] if append else table, not append,
                                        seq.runner_outputs))
                seq.resume = False
            seq.runner_blocks = table
            seq.in_runner = True
        drop, self._drop = self._drop, set()
        sampling = self._sampling_ids(items)
        start = time.perf_counter()
        sampled = self.runner.step(news, cached, {i.request_id: i.num_tokens for i in items},
                                   drop, sampling)
        duration = time.perf_counter() - start
        tokens: dict[str, int] = {}
        logprobs: dict[str, common_pb2.TokenLogprobs] = {}
        stopped: set[str] = set()
        for it in items:
            seq = self._seqs[it.request_id]
            seq.num_computed += it.num_tokens
            if seq.num_computed < len(seq.token_ids):
                continue  # a partial prefill chunk: nothing sampled
            got = sampled.get(it.request_id)
            if got is None:
                raise RuntimeError(f"vllm: no token sampled for {it.request_id}")
            tok = got.token_id
            seq.token_ids.append(tok)
            seq.runner_outputs += 1
            tokens[it.request_id] = tok
            if (lp := logprobs_proto(got)) is not None:
                logprobs[it.request_id] = lp
            n_out = len(seq.token_ids) - seq.prompt_len
            if (tok in seq.stop_ids and n_out >= seq.min_tokens) or n_out >= seq.max_tokens:
                stopped.add(it.request_id)
        return Step(tokens, stopped, duration, realtime_wait=False,
                    kv_used_blocks=sum(len(t) for t in tables.values()), logprobs=logprobs)


class VllmBackend:
    """``--backend vllm``: a prepared HF directory (``--model``) or ``--weights DIR``."""

    def __init__(
        self,
        model: str,
        gpu: str = "cpu",
        seed: int = 0,
        block_size: int | None = None,
        num_blocks: int | None = None,
        weights: str | None = None,
        dtype: str = "bfloat16",
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        threads: int | None = None,
        enforce_eager: bool = False,
        **_: object,
    ) -> None:
        from sloserve.services.executor.vllm_adapter import require_supported
        from sloserve.services.model_store import resolve

        require_supported()  # before any model preparation: one clear line
        self.model = model
        self.gpu = gpu
        self.model_dir = resolve(model, weights)
        self.engine = VllmEngine(VllmRunner(
            self.model_dir, dtype=dtype, block_size=block_size, num_blocks=num_blocks,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, seed=seed,
            threads=threads, enforce_eager=enforce_eager))
        self._lock = threading.Lock()  # the warm-up sweep runs in a thread at startup

    def describe(self) -> executor_pb2.ExecutorDescription:
        from sloserve.model.tokenizer import ChatTemplate

        tok = self.model_dir / "tokenizer.json"
        chat = ChatTemplate.from_hf_config(self.model_dir / "tokenizer_config.json")
        return executor_pb2.ExecutorDescription(
            model=self.model, hardware=self.gpu, backend="vllm",
            kv_capacity_blocks=self.engine.num_blocks, block_size=self.engine.block_size,
            max_context=self.engine.runner.max_model_len,
            tokenizer_json=tok.read_text() if tok.is_file() else "",
            chat_template=chat.template, bos_token=chat.bos_token, eos_token=chat.eos_token,
            eos_token_ids=list(self.engine.runner.eos_token_ids),
        )

    def reset(self) -> None:
        with self._lock:
            self.engine.reset()

    def execute(self, plan: executor_pb2.BatchPlan) -> Step:
        with self._lock:
            return self.engine.execute(plan)

    def warmup_samples(self) -> list[BatchSample]:
        """A short profiling sweep on the real engine for the perf model's warm start.

        Small on purpose: plans wait while it runs (``sloserve profile --backend
        vllm`` is the full sweep)."""
        from sloserve.services.executor.vllm_profile import profile_batch, warmup_shapes

        with self._lock:
            out = []
            for shape in warmup_shapes(self.engine):
                try:
                    out.append(BatchSample(shape, profile_batch(self.engine, shape)))
                except ValueError:  # more KV or tokens than this engine holds
                    continue
        return out
