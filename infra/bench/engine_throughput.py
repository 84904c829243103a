"""Engine throughput, side by side: stock vLLM vs sloserve's ``vllm`` and ``torch`` backends.

The same batch on every side: 32 prompts (16-63 tokens, the same token ids)
x 64 greedy tokens of SmolLM2-135M-Instruct with ``ignore_eos``; throughput =
output tokens actually produced / wall time of the generation call (model
loading and a small warm-up batch excluded). Sides:

* ``stock``: ``vllm.LLM(model=DIR).generate`` - vLLM's default setup
  (engine core in a spawned process);
* ``stock-inproc``: the same with the engine core in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and the torch thread count our
  backend uses (``vllm_adapter.serving_threads``: cores - 1, as stock vLLM's
  worker gets when its engine core runs in another process);
* ``sloserve-vllm`` / ``sloserve-vllm-sarathi``: our ``VllmBackend``, fed the
  plans of our real ``Instance`` with the ``vllm`` policy (FCFS,
  prefill-first, as vLLM schedules) or the ``sarathi`` policy (512-token
  budget), in-process (:class:`PlanDriver`, no gRPC): the engine path alone;
* ``sloserve-vllm-grpc``: the same plans (``vllm`` policy) sent over gRPC to
  the executor service (``python -m sloserve.services.executor --backend
  vllm``), one ``Execute`` stream as the scheduler holds it;
* ``sloserve-torch``: our ``TorchEngine`` (``--backend torch``, float32),
  ``vllm`` policy.

Every vLLM side runs vLLM's compiled model (stock ``vllm serve``'s default:
on CPU dynamo traced once with dynamic shapes and inductor), or every one the
eager model with ``--enforce-eager``. Per-iteration time = wall time / engine
iterations: counted for our sides (plans executed) and for ``stock-inproc``
(engine-core steps); ``stock``'s engine core is another process, so its
iterations are taken as ``--max-tokens`` (the whole batch fits one step's
token budget, so every sequence gets one token per iteration; the counted
sides confirm it).

Each side runs in a fresh subprocess with the same environment, one after
the other, ``--repeats`` rounds in the same order, so a busy spell on a
shared machine hits every side in turn. Writes ``--out`` (JSON).

    python infra/bench/engine_throughput.py --repeats 2 --out docs/results/engine_throughput.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIDES = ("stock", "stock-inproc", "sloserve-vllm", "sloserve-vllm-sarathi", "sloserve-vllm-grpc",
         "sloserve-torch")
TEXT = ("The history of the city begins with a small settlement on the river, where traders "
        "met to exchange salt, grain and wool. Over the centuries the market grew into a town, "
        "the town into a city, and the city into the capital of a large and busy country whose "
        "roads, canals and railways all led back to the old bridge by the harbour.")


class GrpcBackend:
    """The executor service over gRPC: ``Describe`` and one ``Execute`` stream (as the
    scheduler holds it), so a ``PlanDriver`` measures the engine path plus the service."""

    def __init__(self, address: str) -> None:
        import queue

        import grpc

        from sloserve.services.proto import executor_grpc, executor_pb2

        self._pb = executor_pb2
        self._channel = grpc.insecure_channel(address)
        self._stub = executor_grpc.ExecutorStub(self._channel)
        self._q: queue.Queue[Any] = queue.Queue()
        self._results = self._stub.Execute(iter(self._q.get, None))

    def describe(self) -> Any:
        return self._stub.Describe(self._pb.DescribeRequest(), timeout=600)

    def execute(self, plan: Any) -> Any:
        from sloserve.services.executor.backends import Step

        self._q.put(plan)
        res = next(self._results)
        return Step({t.request_id: t.token_id for t in res.tokens}, set(res.stopped),
                    res.duration_s)

    def close(self) -> None:
        self._q.put(None)
        self._channel.close()


def start_executor(dtype: str, enforce_eager: bool) -> tuple[Any, str]:
    """``python -m sloserve.services.executor --backend vllm`` on a free port."""
    from sloserve.services.proto import SERVICE_NAMES
    from sloserve.services.rpc import wait_healthy
    from sloserve.services.store import free_port

    port = free_port("127.0.0.1")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sloserve.services.executor", "--host", "127.0.0.1", "--port",
         str(port), "--backend", "vllm", "--model", "smollm2-135m", "--gpu", "cpu",
         "--redis-url", redis_url, "--prefix", f"bench-engine:{os.getpid()}", "--dtype", dtype,
         *(["--enforce-eager"] if enforce_eager else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    wait_healthy(address, SERVICE_NAMES["executor"], 600)
    return proc, address


def prompts(tokenizer_json: str, n: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_str(tokenizer_json).encode(TEXT * 2).ids
    return [list(ids[k % 11: k % 11 + 16 + (7 * k) % 48]) for k in range(n)]


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    from sloserve.services.model_store import resolve

    model_dir = resolve("smollm2-135m")
    batch = prompts((model_dir / "tokenizer.json").read_text(), args.num_prompts)
    warm = [p[:8] for p in batch[:4]]
    extra: dict[str, Any] = {}
    t0 = time.perf_counter()
    if side.startswith("stock"):
        if side == "stock-inproc":  # vLLM's in-process engine, with our thread count
            from sloserve.services.executor.vllm_adapter import set_cpu_threads

            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            set_cpu_threads()
        from sloserve.services.vllm_env import hide_broken

        hide_broken()
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        from sloserve.services.executor.vllm_adapter import CPU_KV_BYTES

        # the KV cache our backend gets by default: vLLM's own default reserves 92 % of
        # the node's memory, which a shared machine does not have
        llm = LLM(model=str(model_dir), dtype=args.dtype, seed=0,
                  kv_cache_memory_bytes=CPU_KV_BYTES, enforce_eager=args.enforce_eager)
        load_s = time.perf_counter() - t0
        engine = llm.llm_engine
        step = engine.step
        steps = [0]

        def counted_step() -> Any:
            out = step()
            steps[0] += 1
            return out

        engine.step = counted_step  # type: ignore[method-assign]

        def gen(ps: list[list[int]], n: int) -> int:
            sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            steps[0] = 0
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp,
                                use_tqdm=False)
            # in-process, one engine.step is one engine-core iteration; with the core in
            # another process a step only collects outputs
            extra["iterations"] = steps[0] if side == "stock-inproc" else n
            extra["iterations_counted"] = side == "stock-inproc"
            return sum(len(o.outputs[0].token_ids) for o in outs)
    else:
        from sloserve.services.executor.backends import make_backend
        from sloserve.services.executor.plan_driver import PlanDriver
        from sloserve.services.proto import common_pb2

        backend: Any
        if side == "sloserve-torch":
            backend = make_backend("torch", model="smollm2-135m", gpu="cpu")
        elif side == "sloserve-vllm-grpc":
            proc, address = start_executor(args.dtype, args.enforce_eager)
            atexit.register(proc.terminate)
            backend = GrpcBackend(address)
        else:
            backend = make_backend("vllm", model="smollm2-135m", gpu="cpu", dtype=args.dtype,
                                   enforce_eager=args.enforce_eager)
            extra["compilation"] = backend.engine.runner.compilation
        load_s = time.perf_counter() - t0
        policy = "sarathi" if side.endswith("sarathi") else "vllm"
        greedy = common_pb2.Sampling(temperature=0.0, ignore_eos=True)

        def gen(ps: list[list[int]], n: int) -> int:
            d = PlanDriver(backend, policy=policy, token_budget=512)
            for k, p in enumerate(ps):
                d.submit(f"r{k}", p, n, greedy)
            res = d.run()
            extra["engine_s"], extra["iterations"] = res.engine_s, res.iterations
            extra["iterations_counted"] = True
            return sum(len(t) for t in res.tokens.values())

    gen(warm, 4)
    start = time.perf_counter()
    tokens = gen(batch, args.max_tokens)
    wall = time.perf_counter() - start
    return {"side": side, "tokens": tokens, "wall_s": wall, "tok_per_s": tokens / wall,
            "per_iteration_s": wall / extra["iterations"] if extra.get("iterations") else None,
            "load_s": load_s, "loadavg_1m": os.getloadavg()[0], **extra}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32",
                   help="vLLM sides (torch runs float32); without bf16 instructions (AVX2 CPUs) "
                        "bfloat16 is emulated and several times slower")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vLLM sides: the eager model (default: compiled, as stock vllm serve)")
    p.add_argument("--out", default=None)
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)  # child mode
    args = p.parse_args()
    if args.side:
        print("RESULT " + json.dumps(run_side(args.side, args)), flush=True)
        return 0
    sides = [s for s in args.sides.split(",") if s]
    bad = [s for s in sides if s not in SIDES]
    if bad:
        p.error(f"--sides: unknown {bad}; choose from {list(SIDES)}")
    rounds: list[list[dict[str, Any]]] = []
    for r in range(args.repeats):
        row = []
        for side in sides:
            cmd = [sys.executable, __file__, "--side", side, "--num-prompts", str(args.num_prompts),
                   "--max-tokens", str(args.max_tokens), "--dtype", args.dtype]
            if args.enforce_eager:
                cmd.append("--enforce-eager")
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
            if res.returncode != 0 or not line:
                print(res.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"side {side} failed (exit {res.returncode})")
            out = json.loads(line[-1][len("RESULT "):])
            per = out["per_iteration_s"]
            print(f"round {r + 1} {side:<22} {out['tok_per_s']:8.1f} tok/s ({out['tokens']} "
                  f"tokens in {out['wall_s']:.1f} s, "
                  f"{'-' if per is None else f'{per * 1e3:.1f}'} ms/iteration; "
                  f"load {out['loadavg_1m']:.1f})", flush=True)
            row.append(out)
        rounds.append(row)
    summary: dict[str, Any] = {"per_round": []}
    for row in rounds:
        by = {o["side"]: o["tok_per_s"] for o in row}
        per = {f"{o['side']}_ms_per_iteration": round(o["per_iteration_s"] * 1e3, 2)
               for o in row if o["per_iteration_s"]}
        stock = [v for k, v in by.items() if k.startswith("stock")]
        best = max(stock) if stock else None
        summary["per_round"].append({
            **by, **per, "best_stock": best,
            **({f"{k}_vs_best_stock": v / best for k, v in by.items()
                if best and k.startswith("sloserve")}),
        })
    doc = {"batch": {"prompts": args.num_prompts, "max_tokens": args.max_tokens,
                     "model": "smollm2-135m", "ignore_eos": True, "greedy": True},
           "dtype": args.dtype, "enforce_eager": args.enforce_eager, "threads_env": {
               k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")},
           "cpus": os.cpu_count(), "rounds": rounds, "summary": summary}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
