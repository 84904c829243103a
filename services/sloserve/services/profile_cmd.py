"""``sloserve profile``: measure an executor's batch times and fit Ascendra's regression.

``--backend torch`` times our ``TorchEngine``; ``--backend vllm`` times vLLM's
engine driven exactly as the ``vllm`` executor backend drives it
(``sloserve.services.executor.vllm_profile``).

vLLM-style profiling run on the real engine: a sweep of prefill-only,
decode-only and mixed batches with varied context, each timed in
``--repeats`` rounds over the shuffled sweep; the sample is the fastest run
(as ``timeit``: slower runs measure other processes competing for the cores,
not the batch, and shuffled rounds keep one busy spell off any shape's runs).
On CPU the default is one torch thread timed by process CPU time (``--clock
cpu``): the batch's cost on one core, unaffected by other processes sharing
the machine; ``--clock wall --threads N`` times a dedicated machine instead.
The device's peak FLOP/s and memory bandwidth are measured first by a
matmul / copy microbenchmark and
registered as ``Hardware`` (``cpu`` or ``cuda``) so the regression's tM/tF
are real roofline seconds (Ascendra §3.3). 80 % of the samples train the
regression, 20 % are held out for ``mape_holdout``. ``--out FILE`` saves the
samples (with the hardware) for ``sloserve simulate --timing-profile FILE``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.hardware import Hardware, register_hardware
from sloserve.perf.measured import MeasuredTiming, save_samples
from sloserve.perf.models import ModelShape
from sloserve.perf.regression import AscendraRegression
from sloserve.services.argtypes import number
from sloserve.services.executor.backends import TORCH, VLLM

_PREFILL_CHUNKS = (8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)
_PREFILL_CTX = (0, 128, 512, 1024, 4096)
_DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_DECODE_CTX = (16, 64, 256, 1024, 4096)
_MIXED_CHUNKS = (16, 64, 128, 256, 512, 2048)
_MIXED_DECODES = (1, 4, 16, 32, 128)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile", help="time batch shapes on a real executor and fit the Ascendra regression"
    )
    p.add_argument("--backend", choices=(TORCH, VLLM), default="torch",
                   help="torch: our TorchEngine; vllm: vLLM's engine driven as our executor")
    p.add_argument("--model", default="tiny", help="preset (tiny, smollm2-135m, llama-3-8b, ...)")
    p.add_argument("--weights", default=None,
                   help="HF directory or .gguf (default: random init; vllm: the prepared model)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default=None,
                   help="torch: float32 (cpu default) | bfloat16 (cuda default); vllm: bfloat16")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vllm: time the eager model (default: compiled, as the executor runs it)")
    p.add_argument("--max-tokens", type=number(int, 8, False), default=None,
                   help="largest batch in tokens (default 512 on cpu, 4096 on cuda)")
    p.add_argument("--max-context", type=number(int, 16, False), default=None,
                   help="largest context (default 1024 on cpu, 4096 on cuda)")
    p.add_argument("--repeats", type=number(int, 1, False), default=5,
                   help="timings per shape; the fastest is kept")
    p.add_argument("--threads", type=number(int, 1, False), default=None,
                   help="torch CPU threads (default 1 on cpu; vllm: as its executor, cores - 1)")
    p.add_argument("--clock", choices=("wall", "cpu"), default=None,
                   help="wall time (cuda default, synchronised) or process CPU time (cpu default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="save the samples (JSON) to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def sweep_shapes(max_tokens: int, max_context: int, seed: int) -> list[BatchShape]:
    """Prefill-only, decode-only and mixed shapes within the token and context caps.

    Contexts are jittered (+-50 %, seeded) so the samples do not sit on one grid line.
    """
    rng = random.Random(seed)

    def ctx(mean: int, room: int) -> int:
        return max(0, min(int(mean * rng.uniform(0.5, 1.5)), max_context - room))

    shapes: list[BatchShape] = []
    for c in (c for c in _PREFILL_CHUNKS if c <= min(max_tokens, max_context)):
        for mean in (m for m in _PREFILL_CTX if m <= max_context):
            shapes.append(BatchShape(prefills=((c, ctx(mean, c)),)))
        if 2 * c <= max_tokens:
            shapes.append(BatchShape(prefills=((c, 0), (c, ctx(256, c)))))
    for b in (b for b in _DECODE_BATCH if b <= max_tokens):
        for mean in (m for m in _DECODE_CTX if m <= max_context):
            for _ in range(2):
                shapes.append(BatchShape(decodes=tuple(ctx(mean, 1) for _ in range(b))))
    for c in (c for c in _MIXED_CHUNKS if c <= max_context):
        for b in (b for b in _MIXED_DECODES if c + b <= max_tokens):
            for mean in (128, 512):
                shapes.append(BatchShape(prefills=((c, ctx(mean, c)),),
                                         decodes=tuple(ctx(mean, 1) for _ in range(b))))
    return shapes


def measure_hardware(device: str, dtype: str) -> Hardware:
    """Peak FLOP/s (square matmul) and memory bandwidth (tensor copy), best of 5 each."""
    import torch

    from sloserve.model.engine import DTYPES

    dev = torch.device(device)
    dt = DTYPES[dtype]

    def best(fn: Any) -> float:
        fn()
        times = []
        for _ in range(5):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            start = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - start)
        return min(times)

    n = 1024 if dev.type == "cpu" else 8192
    a = torch.randn(n, n, device=dev).to(dt)
    flops = 2 * n**3 / best(lambda: a @ a)
    src = torch.empty(2**24 if dev.type == "cpu" else 2**28, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    src.fill_(1.0)
    dst.fill_(0.0)
    bandwidth = 2 * src.numel() * 4 / best(lambda: dst.copy_(src))
    if dev.type == "cuda":
        mem = float(torch.cuda.get_device_properties(dev).total_memory)
    else:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return Hardware(dev.type, flops, bandwidth, mem)


class _Engine(Protocol):
    """What the sweep needs from an engine (``TorchEngine`` or the vLLM profiler)."""

    num_blocks: int
    block_size: int
    weights_loaded: bool

    @property
    def perf_shape(self) -> ModelShape: ...

    @property
    def name(self) -> str: ...

    def profile_batch(self, shape: BatchShape, clock: Callable[[], float]) -> float: ...


class _TorchProfiled:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.num_blocks, self.block_size = engine.num_blocks, engine.block_size
        self.weights_loaded = bool(engine.weights_loaded)

    @property
    def perf_shape(self) -> ModelShape:
        shape: ModelShape = self.engine.perf_shape
        return shape

    @property
    def name(self) -> str:
        return str(self.engine.config.name)

    def profile_batch(self, shape: BatchShape, clock: Callable[[], float]) -> float:
        return float(self.engine.profile_batch(shape, clock))


def run(args: argparse.Namespace) -> int:
    import torch

    cuda = args.device.startswith("cuda")
    clock_name = args.clock or ("wall" if cuda else "cpu")
    if cuda and clock_name == "cpu":
        raise ValueError("--clock: cpu time does not measure CUDA kernels; use --clock wall")
    clock = time.perf_counter if clock_name == "wall" else time.process_time
    max_tokens = args.max_tokens or (4096 if cuda else 512)
    engine, dtype = _engine(args, cuda, max_tokens)
    max_context = min(args.max_context or (4096 if cuda else 1024),
                      engine.perf_shape.max_context - 1)
    capacity = engine.num_blocks * engine.block_size
    shapes = [
        s for s in sweep_shapes(max_tokens, max_context, args.seed)
        if sum(c + ctx + engine.block_size for c, ctx in s.prefills)
        + sum(d + 1 + engine.block_size for d in s.decodes) <= capacity
    ]
    hw = measure_hardware(args.device, dtype)
    register_hardware(hw)
    for shape in shapes[:: max(1, len(shapes) // 8)]:  # warm-up: allocator, kernels, caches
        engine.profile_batch(shape, clock)
    rng = random.Random(args.seed)
    best = _best_times(engine, shapes, clock, args.repeats, rng)
    samples = [BatchSample(s, t) for s, t in zip(shapes, best)]
    order = list(range(len(samples)))
    rng.shuffle(order)
    cut = int(0.8 * len(order))
    train = [samples[i] for i in order[:cut]]
    holdout = [samples[i] for i in order[cut:]]
    reg = AscendraRegression(engine.perf_shape, hw)
    reg.fit(train)
    decode8 = BatchShape(decodes=(128,) * 8)
    decode8_time = min(engine.profile_batch(decode8, clock) for _ in range(args.repeats))
    result: dict[str, Any] = {
        "samples": len(samples),
        "mape_holdout": reg.mape(holdout),
        "coefficients": list(reg.coefficients),
        "model": engine.name,
        "backend": args.backend,
        "device": args.device,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "clock": clock_name,
        "weights_loaded": engine.weights_loaded,
        "hardware": {"peak_flops": hw.peak_flops, "mem_bandwidth": hw.mem_bandwidth},
        "measured_fit_mape_holdout": MeasuredTiming(train, noise_cv=0.0).mape(holdout),
        "decode8_tokens_per_s": 8 / decode8_time,
        "samples_file": None,
    }
    _report(args, result, samples, hw, engine.name, dtype, clock_name)
    return 0


def _engine(args: argparse.Namespace, cuda: bool, max_tokens: int) -> tuple[_Engine, str]:
    """The engine to profile (vLLM's or ours) and its dtype."""
    import torch

    engine: _Engine
    if args.backend == VLLM:
        from sloserve.services.executor.vllm_profile import VllmProfiled

        dtype = args.dtype or "bfloat16"
        engine = VllmProfiled(args.model, args.weights, dtype, args.seed, args.threads,
                              max_num_batched_tokens=max(max_tokens, 2048),
                              enforce_eager=args.enforce_eager)
    else:
        from sloserve.model.engine import TorchEngine

        if args.threads or not cuda:
            torch.set_num_threads(args.threads or 1)
        dtype = args.dtype or ("bfloat16" if cuda else "float32")
        engine = _TorchProfiled(TorchEngine(
            args.model, weights=args.weights, device=args.device, dtype=dtype, seed=args.seed,
            max_num_batched_tokens=max_tokens))
    return engine, dtype


def _best_times(engine: _Engine, shapes: list[BatchShape], clock: Callable[[], float],
                repeats: int, rng: random.Random) -> list[float]:
    """Each shape's fastest of ``repeats`` runs, the rounds in shuffled order: a busy
    spell hits no shape twice."""
    best = [math.inf] * len(shapes)
    for _ in range(repeats):
        order = list(range(len(shapes)))
        rng.shuffle(order)
        for i in order:
            best[i] = min(best[i], engine.profile_batch(shapes[i], clock))
    return best


def _report(args: argparse.Namespace, result: dict[str, Any], samples: list[BatchSample],
            hw: Hardware, name: str, dtype: str, clock_name: str) -> None:
    """Save the samples (``--out``) and print the result (``--json`` or one line a key)."""
    import torch

    if args.out:
        save_samples(args.out, samples, hw, model=name, device=args.device,
                     dtype=dtype, threads=torch.get_num_threads(), clock=clock_name,
                     backend=args.backend)
        result["samples_file"] = args.out
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
