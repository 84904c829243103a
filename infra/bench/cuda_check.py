"""The torch backend's CUDA path on a lent GPU (issue 15, item 7), one script, one JSON.

Run on a machine with a GPU (the device tool), from the repository root:

    PYTHONPATH=shared:services python3 infra/bench/cuda_check.py --out cuda_check.json

Steps, each recorded (with its error, if any) before the next starts:

1. ``env``: torch, the GPU, whether ``flash_attn`` and ``vllm`` import.
2. ``chunked_equals_unchunked``: ``TorchEngine`` on CUDA, SmolLM2-135M's shape with random
   weights, float32 (our paged attention) and bfloat16 (flash-attn where it imports):
   a 200-token prompt prefilled in chunks of 64 beside another request's decodes must
   give the same tokens as the same prompt prefilled whole (item 1's check; seeded
   sampling at temperature 1, which random weights make far more sensitive than greedy).
3. ``profile``: ``sloserve profile --backend torch --model llama-3-8b --device cuda``
   (bfloat16, random weights, wall clock): held-out MAPE of Ascendra's regression and of
   the piecewise fit (item 6).
4. ``throughput``: llama-3-8b bfloat16, 32 sequences x 64 greedy tokens after a
   128-token prompt, ``ignore_eos``: generated tokens per second, counting the tokens
   actually produced.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from sloserve.batch import BatchPlan, ScheduledItem
from sloserve.kv import BlockManager
from sloserve.model.engine import TorchEngine
from sloserve.model.sampling import SamplingParams

# seeded sampling at temperature 1: with random weights greedy picks one token over and
# over, while a seeded draw from near-uniform logits changes with any difference in them
SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
# --smoke-cpu (a dry run of this script here): cpu, the tiny model, float32 only
DEV = {"device": "cuda", "small": "smollm2-135m", "big": "llama-3-8b",
       "dtypes": ("float32", "bfloat16"), "big_dtype": "bfloat16"}


def sync() -> None:
    if DEV["device"] == "cuda":
        torch.cuda.synchronize()


def env() -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
        out["memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    for mod in ("flash_attn", "vllm", "google.protobuf", "grpc"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            out[mod] = getattr(m, "__version__", "importable")
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            out[mod] = f"not importable: {type(exc).__name__}: {exc}"[:200]
    return out


class Runner:
    """Plans a few requests by hand over one engine and its own ``BlockManager``."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine
        self.kv = BlockManager(engine.num_blocks, engine.block_size)
        self.done: dict[str, int] = {}  # request id -> tokens computed

    def add(self, rid: str, prompt: list[int], params: SamplingParams = SEEDED) -> None:
        self.engine.add_request(rid, prompt, params)
        self.done[rid] = 0

    def step(self, work: dict[str, tuple[int, bool]]) -> dict[str, int]:
        """One plan: request id -> (tokens, is_prefill)."""
        items = []
        for rid, (n, prefill) in work.items():
            self.kv.allocate(rid, self.done[rid] + n)
            items.append(ScheduledItem(rid, n, self.done[rid], prefill))
            self.done[rid] += n
        tables = {r: self.kv.block_table(r) for r in work}
        return self.engine.execute(BatchPlan(items), tables).tokens


def sampled_tokens(engine: TorchEngine, prompt: list[int], other: list[int], chunk: int | None,
                  steps: int = 16) -> list[int]:
    """The target's tokens; ``chunk``: its prefill in chunks beside the other
    request's decodes (None: whole, alone)."""
    run = Runner(engine)
    tag = f"{chunk}"
    target, side = f"t{tag}", f"o{tag}"
    run.add(target, prompt)
    run.add(side, other)
    out: list[int] = []
    if chunk is None:
        out.append(run.step({target: (len(prompt), True)})[target])
    else:
        run.step({side: (len(other), True)})
        left = len(prompt)
        while left:
            n = min(chunk, left)
            toks = run.step({target: (n, True), side: (1, False)})
            left -= n
            if not left:
                out.append(toks[target])
    while len(out) < steps:
        out.append(run.step({target: (1, False)})[target])
    for rid in (target, side):
        engine.free(rid)
        run.kv.free(rid)
    return out


def chunked_equals_unchunked() -> dict[str, Any]:
    res: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(1)
    for dtype in DEV["dtypes"]:
        engine = TorchEngine(str(DEV["small"]), device=str(DEV["device"]), dtype=str(dtype),
                             num_blocks=512, seed=3)
        vocab = engine.config.shape.vocab_size
        prompt = torch.randint(0, vocab, (200,), generator=gen).tolist()
        other = torch.randint(0, vocab, (40,), generator=gen).tolist()
        whole = sampled_tokens(engine, prompt, other, None)
        chunked = sampled_tokens(engine, prompt, other, 64)
        res[dtype] = {"flash_attn_used": engine.use_flash, "whole": whole, "chunked": chunked,
                      "equal": whole == chunked,
                      "first_difference": next((i for i, (a, b) in enumerate(zip(whole, chunked))
                                                if a != b), None)}
        del engine
        free_cuda()
    return res


def profile(out_dir: Path) -> dict[str, Any]:
    from sloserve.services.profile_cmd import add_parser, run

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["profile", "--backend", "torch", "--model", str(DEV["big"]),
                              "--device", str(DEV["device"]), "--dtype", str(DEV["big_dtype"]),
                              "--repeats", "2", "--clock", "wall", "--json",
                              "--out", str(out_dir / "torch_cuda_profile.json")])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        run(args)
    free_cuda()
    result: dict[str, Any] = json.loads(buf.getvalue().strip().splitlines()[-1])
    return result


def throughput(num_seqs: int = 32, prompt_len: int = 128, new_tokens: int = 64) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine = TorchEngine(str(DEV["big"]), device=str(DEV["device"]),
                         dtype=str(DEV["big_dtype"]), seed=0,
                         max_num_batched_tokens=num_seqs * prompt_len,
                         num_blocks=None if DEV["device"] == "cuda" else 2048)
    build_s = time.perf_counter() - t0
    vocab = engine.config.shape.vocab_size
    gen = torch.Generator().manual_seed(2)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    rounds = []
    for r in range(2):  # the first is a warm-up
        run = Runner(engine)
        rids = [f"r{r}s{i}" for i in range(num_seqs)]
        for rid in rids:
            run.add(rid, torch.randint(0, vocab, (prompt_len,), generator=gen).tolist(), params)
        sync()
        start = time.perf_counter()
        produced = len(run.step({rid: (prompt_len, True) for rid in rids}))
        steps = 1
        while steps < new_tokens:
            produced += len(run.step({rid: (1, False) for rid in rids}))
            steps += 1
        sync()
        wall = time.perf_counter() - start
        rounds.append({"tokens": produced, "wall_s": wall, "tok_s": produced / wall,
                       "iterations": steps})
        for rid in rids:
            engine.free(rid)
    out = {"model": f"{DEV['big']} (random weights)", "dtype": DEV["big_dtype"],
           "flash_attn_used": engine.use_flash, "num_blocks": engine.num_blocks,
           "engine_build_s": build_s, "batch": f"{num_seqs} x {new_tokens} greedy tokens after "
           f"{prompt_len}-token prompts, ignore_eos", "warmup": rounds[0], "measured": rounds[1]}
    del engine
    free_cuda()
    return out


def free_cuda() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def recorded(report: dict[str, Any], name: str, path: Path) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a failed step is a result, the next one runs
        report[name] = {"error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()[-3000:]}
        free_cuda()
    report.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 2)
    path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", nargs="+", default=["env", "chunked", "profile", "throughput"])
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="dry run on this CPU: the tiny model, float32")
    args = ap.parse_args()
    if args.smoke_cpu:
        DEV.update(device="cpu", small="tiny", big="tiny", dtypes=("float32",),
                   big_dtype="float32")
    report: dict[str, Any] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "env": env, "chunked": chunked_equals_unchunked,
        "profile": lambda: profile(args.out.parent), "throughput": throughput}
    for name in args.steps:
        with recorded(report, name, args.out):
            report[name] = steps[name]()
        print(name, json.dumps(report[name])[:600], flush=True)


if __name__ == "__main__":
    main()
