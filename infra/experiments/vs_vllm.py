"""Stock ``vllm serve`` vs ``sloserve up --backend vllm``, side by side (docs/lab/vs-vllm.md).

One model (SmolLM2-135M-Instruct, the directory ``sloserve model prepare
smollm2-135m`` writes), one CPU, one workload for every arm: Poisson arrivals
of ShareGPT lengths / 8 (``infra/experiments/data/sharegpt_cpu.csv``), the
same seed and the same prompt token ids, exact output lengths (``ignore_eos``).
Arms, each started fresh and swept over every rate:

* ``vllm-serve``: stock ``vllm serve`` with its defaults (vLLM 0.32 on CPU:
  chunked prefill on, 2048 batched tokens, 128 sequences);
* ``vllm-serve-nochunk``: ``--no-enable-chunked-prefill``;
* ``vllm-serve-sarathi``: ``--enable-chunked-prefill --max-num-batched-tokens B``
  with Sarathi's budget B (and ``--max-num-seqs B``, which vLLM requires to be
  ≤ the batched tokens);
* ``sloserve-<policy>``: ``sloserve up --backend vllm --policy <policy>``,
  one instance, token budget B, for vllm, sarathi and accelgen.

Stock servers are benched with ``sloserve bench --endpoint openai`` and our
stack with ``sloserve bench`` (gRPC); both summarise with
``sloserve.metrics.summarize``. SLOs and B are the A100 defaults (TTFT 1 s,
TBT 0.15 s, budget 512) scaled as in docs/torch-executor.md: B by the length
factor 8, the SLOs by the ratio r of one typical mixed iteration, scaled
(a 64-token chunk over 128 tokens of context plus 16 decodes at context ~320),
as stock vLLM runs it on this CPU (its own compiled engine and scheduler,
in-process, one torch thread as ``vllm serve`` here, median of 7:
:func:`time_stock`), to the same iteration unscaled for llama-3-8b on an A100
(``ProfileTiming``). The same shape through our ``vllm`` backend is recorded
beside it (:func:`time_ours`).

    python infra/experiments/vs_vllm.py [--rates 0.5 1 1.5 2] [--num-requests 100]
        [--arms ...] [--slo-from JSON] [--plot-only]

Writes docs/results/vs_vllm.json and docs/results/vs_vllm.png.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import httpx

from sloserve.batch import BatchShape
from sloserve.metrics import meets
from sloserve.policies import get_spec
from sloserve.services.store import free_port

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "infra/experiments/data/sharegpt_cpu.csv"
OUT = ROOT / "docs/results/vs_vllm.json"
SCALE = 8  # make_sharegpt_cpu.SCALE
A100_TTFT, A100_TBT, A100_BUDGET = 1.0, 0.15, 512
MODEL = "smollm2-135m"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
STOCK = {
    "vllm-serve": [],
    "vllm-serve-nochunk": ["--no-enable-chunked-prefill"],
    "vllm-serve-sarathi": ["--enable-chunked-prefill", "--max-num-batched-tokens", "{budget}",
                           "--max-num-seqs", "{budget}"],
}
POLICIES = ("vllm", "sarathi", "accelgen", "slack")  # slack: docs/lab/beyond.md, "Our policy"
# our arms as the stack ships (admission control on) and variants with `up` flags
VARIANTS: dict[str, tuple[str, list[str]]] = {f"sloserve-{p}": (p, []) for p in POLICIES} | {
    # Sarathi-Serve as the paper has it: every request queued, none shed at the door
    "sloserve-sarathi-noshed": ("sarathi", ["--no-shed-late"]),
}
ARMS = (*STOCK, *VARIANTS)
SARATHI_ARMS = ("sloserve-sarathi", "sloserve-sarathi-noshed")
CRITERIA = ("goodput", "tail_p99", "token")
START_S = 900.0
# torch threads of our executor (and of the calibration): stock vLLM on CPU serves with one
# OpenMP thread pinned to a core and leaves the other to its API server; two threads on
# this shared 2-core machine made every step 3-10x slower (OpenMP waits on a taken core)
THREADS = 1


# --- SLO scaling ------------------------------------------------------------------
def mixed_shapes() -> tuple[BatchShape, BatchShape]:
    """(scaled shape timed here, unscaled shape timed on the A100 model)."""
    full = BatchShape(((A100_BUDGET, 1024),), (2560,) * 16)
    scaled = BatchShape(((A100_BUDGET // SCALE, 1024 // SCALE),), (2560 // SCALE,) * 16)
    return scaled, full


class Measuring:
    """Around the timed part only: hold ``lock`` (a shared machine's measurement lock,
    ``flock``) and run at nice 0; the engine's load and compile before it run at whatever
    priority the process was started with (nice 19 on a shared machine)."""

    def __init__(self, lock: str | None) -> None:
        self.lock = lock
        self._fd: int | None = None
        self._nice: dict[int, int] = {}
        self.loadavg: list[float] = []

    def _renice(self, value: int | None) -> None:
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            try:
                if value is None:
                    self._nice[tid] = os.getpriority(os.PRIO_PROCESS, tid)
                    os.setpriority(os.PRIO_PROCESS, tid, 0)
                else:
                    os.setpriority(os.PRIO_PROCESS, tid, self._nice.get(tid, value))
            except (PermissionError, ProcessLookupError):
                pass

    def __enter__(self) -> Measuring:
        if self.lock:
            import fcntl

            self._fd = os.open(self.lock, os.O_RDWR | os.O_CREAT)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._renice(None)
        self.loadavg.append(os.getloadavg()[0])
        return self

    def __exit__(self, *exc: object) -> None:
        self.loadavg.append(os.getloadavg()[0])
        if self._fd is not None:
            import fcntl

            self._renice(19)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def time_ours(dtype: str, repeats: int = 7, enforce_eager: bool = False,
              lock: str | None = None) -> dict[str, Any]:
    """The scaled mixed iteration through our ``vllm`` backend (``profile_batch``: the
    engine step alone, no scheduler), for comparison with stock's."""
    import numpy as np

    from sloserve.services.executor.vllm_backend import VllmBackend
    from sloserve.services.executor.vllm_profile import profile_batch

    scaled, _ = mixed_shapes()
    backend = VllmBackend(MODEL, gpu="cpu", dtype=dtype, enforce_eager=enforce_eager)
    profile_batch(backend.engine, scaled)  # warm-up
    with Measuring(lock) as m:
        times = [profile_batch(backend.engine, scaled, seed=k) for k in range(repeats)]
    return {"iteration_s": float(np.median(times)), "runs_s": times,
            "compilation": backend.engine.runner.compilation, "loadavg_1m": m.loadavg}


def time_stock(dtype: str, repeats: int = 7, lock: str | None = None) -> dict[str, Any]:
    """The scaled mixed iteration as stock vLLM runs it: its own engine (compiled, its
    defaults), its own scheduler, in-process, one torch thread (as ``vllm serve`` here).

    16 requests of a ``D``-token prompt are prefilled and decoding; then, ``repeats``
    times, a request of ``C + P`` tokens arrives. With ``max_num_batched_tokens`` =
    16 + ``C`` vLLM's chunked-prefill scheduler runs the 16 decodes plus ``C``-token
    chunks of it; the step whose chunk starts at context ``P`` is the shape (a C-token
    chunk over P plus 16 decodes) and is timed around ``LLMEngine.step`` (scheduler,
    model, sampler and output processing: stock's iteration). The scheduler's own
    output is checked to be that shape."""
    import numpy as np

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from sloserve.services.executor.vllm_adapter import CPU_KV_BYTES, set_cpu_threads
    from sloserve.services.model_store import resolve
    from sloserve.services.vllm_env import hide_broken

    set_cpu_threads(THREADS)
    hide_broken()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    scaled, _ = mixed_shapes()
    ((chunk, ctx),) = scaled.prefills
    n_dec, d_ctx = len(scaled.decodes), scaled.decodes[0]
    llm = LLM(model=str(resolve(MODEL)), dtype=cast(Any, dtype), seed=0,
              kv_cache_memory_bytes=CPU_KV_BYTES, enable_chunked_prefill=True,
              max_num_batched_tokens=chunk + n_dec, max_num_seqs=n_dec + 1,
              enable_prefix_caching=False,
              enforce_eager=bool(os.environ.get("VS_VLLM_DEBUG_EAGER")))
    engine = llm.llm_engine
    sched = cast(Any, engine.engine_core).engine_core.scheduler
    schedule = sched.schedule
    seen: list[dict[str, Any]] = []

    def recording_schedule(*a: Any, **kw: Any) -> Any:
        before = {rid: int(r.num_computed_tokens) for rid, r in sched.requests.items()}
        out = schedule(*a, **kw)
        seen.append({"before": before, "tokens": dict(out.num_scheduled_tokens)})
        return out

    sched.schedule = recording_schedule
    rng = np.random.default_rng(0)

    def prompt(n: int) -> Any:
        return TokensPrompt(prompt_token_ids=[int(x) for x in rng.integers(1000, 40000, n)])

    long = SamplingParams(temperature=0.0, max_tokens=4000, ignore_eos=True, detokenize=False)
    for k in range(n_dec):
        engine.add_request(f"d{k}", prompt(d_ctx), long)
    decoding: set[str] = set()
    while len(decoding) < n_dec:
        for o in engine.step():
            outs = cast(Any, o).outputs
            if outs and outs[0].token_ids:
                decoding.add(o.request_id)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    times: list[float] = []
    contexts: list[float] = []
    measuring = Measuring(lock).__enter__()
    for k in range(repeats + 1):  # the first is a warm-up
        rid = f"x{k}"
        engine.add_request(rid, prompt(ctx + chunk), one)
        done = False
        while not done:
            t0 = time.perf_counter()
            outs = engine.step()
            dt = time.perf_counter() - t0
            rec = seen[-1]
            # the engine core's id is ours plus a suffix LLMEngine adds
            core_id = next((r for r in rec["tokens"] if r == rid or r.startswith(rid + "-")),
                           None)
            if os.environ.get("VS_VLLM_DEBUG"):
                print(rid, core_id, rec["before"].get(core_id), rec["tokens"].get(core_id),
                      sorted(rec["tokens"].values())[:3], len(rec["tokens"]), file=sys.stderr)
            if (core_id is not None and rec["before"].get(core_id) == ctx
                    and rec["tokens"][core_id] == chunk):
                dec = {r: n for r, n in rec["tokens"].items() if r != core_id}
                if len(dec) != n_dec or set(dec.values()) != {1}:
                    raise RuntimeError(f"stock calibration: step was {rec['tokens']}")
                if k:
                    times.append(dt)
                    contexts.append(float(np.mean([rec["before"][r] for r in dec])))
            done = any(o.request_id == rid and o.finished for o in outs)
    measuring.__exit__(None, None, None)
    engine.abort_request([f"d{k}" for k in range(n_dec)])
    if len(times) != repeats:
        raise RuntimeError(f"stock calibration: the shape was scheduled {len(times)} times "
                           f"in {repeats} rounds")
    return {"iteration_s": float(np.median(times)), "runs_s": times,
            "decode_context_mean": float(np.mean(contexts)), "loadavg_1m": measuring.loadavg,
            "max_num_batched_tokens": chunk + n_dec}


def slos(t_cpu: float, dtype: str, source: str) -> dict[str, Any]:
    """SLOs and budget from one iteration time here against the A100's."""
    from sloserve.perf.ground_truth import ProfileTiming

    _, full = mixed_shapes()
    t_gpu = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0).noiseless_time(full)
    r = t_cpu / t_gpu
    return {"iteration_cpu_s": t_cpu, "iteration_source": source, "iteration_a100_s": t_gpu,
            "ratio": r, "ttft_slo": round(A100_TTFT * r, 4), "tbt_slo": round(A100_TBT * r, 4),
            "token_budget": A100_BUDGET // SCALE, "dtype": dtype}


def calibrate(dtype: str, lock: str | None = None) -> dict[str, Any]:
    """SLOs scaled from stock vLLM's iteration (each side timed in its own child)."""
    def child(side: str) -> dict[str, Any]:
        out = subprocess.run([sys.executable, __file__, "--calibrate-side", side, "--dtype",
                              dtype, *(["--measure-lock", lock] if lock else [])],
                             capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
        if out.returncode:
            raise RuntimeError(f"calibration ({side}) failed: {out.stderr[-2000:]}")
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    stock = child("stock")
    ours = child("sloserve")
    eager = child("sloserve-eager")
    return {**slos(stock["iteration_s"], dtype, "stock vLLM (LLMEngine.step, compiled)"),
            "stock_iteration": stock, "sloserve_iteration": ours,
            "sloserve_eager_iteration": eager}


# --- servers ----------------------------------------------------------------------
class Server:
    """A child process group that serves one arm; ``target`` is what bench talks to."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env}, start_new_session=True, text=True)
        self.target = ""
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_stock(arm: str, model_dir: Path, slo: dict[str, Any], logs: Path) -> Server:
    port = free_port("127.0.0.1")
    extra = [a.format(budget=slo["token_budget"]) for a in STOCK[arm]]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL, "--dtype", slo["dtype"], "--port", str(port),
            "--host", "127.0.0.1", "--seed", "0", *extra]
    srv = Server(argv, {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")},
                 logs / f"{arm}.log")
    srv.target = f"http://127.0.0.1:{port}"
    while time.monotonic() - srv.started < START_S:
        if not srv.alive():
            raise RuntimeError(f"{arm}: vllm serve exited ({srv.proc.returncode}); "
                               f"see {srv.log.name}")
        try:
            if httpx.get(f"{srv.target}/v1/models", timeout=2).status_code == 200:
                return srv
        except httpx.HTTPError:
            pass
        time.sleep(2)
    srv.close()
    raise RuntimeError(f"{arm}: vllm serve not ready after {START_S:.0f} s")


def start_sloserve(arm: str, backend: str, slo: dict[str, Any], logs: Path) -> Server:
    policy, extra = VARIANTS[arm]
    port = free_port("127.0.0.1")
    argv = [sys.executable, "-m", "sloserve.services.cli", "up", "--backend", backend,
            "--model", MODEL, "--gpu", "cpu", "--dtype", slo["dtype"], "--policy", policy,
            "--port", str(port), "--redis-url", REDIS_URL,
            "--prefix", f"vsvllm:{policy}:{os.getpid()}",
            # a policy without a fixed budget (slack sizes each iteration from the tightest
            # TBT slack) has no --token-budget knob
            *(["--token-budget", str(slo["token_budget"])]
              if "token_budget" in get_spec(policy).knobs() else []),
            "--ttft-slo", str(slo["ttft_slo"]),
            "--tbt-slo", str(slo["tbt_slo"]), "--log-dir", str(logs / arm), *extra]
    srv = Server(argv, {"OMP_NUM_THREADS": str(THREADS)}, logs / f"{arm}.log")
    srv.target = f"127.0.0.1:{port}"
    log = Path(srv.log.name)
    while time.monotonic() - srv.started < START_S:
        if not srv.alive():
            raise RuntimeError(f"{arm}: sloserve up exited ({srv.proc.returncode}); see {log}")
        if "gateway ready" in log.read_text():
            return srv
        time.sleep(2)
    srv.close()
    raise RuntimeError(f"{arm}: sloserve up not ready after {START_S:.0f} s")


# --- benching ---------------------------------------------------------------------
def bench(arm: str, target: str, qps: float, n: int, slo: dict[str, Any],
          salt: str) -> dict[str, Any]:
    """One rate against one server. ``salt`` gives the run its own prompt token ids (same
    lengths and arrivals): the warm-up and every rate send the same request ids to one
    server, and stock vLLM's prefix cache (on by default) found the earlier runs' prompts
    cached (hit rate rising to 57 % over a sweep) where real traffic would not repeat them."""
    cmd = [sys.executable, "-m", "sloserve.services.cli", "bench", "--target", target,
           "--trace-file", str(TRACE), "--qps", f"{qps:g}", "--num-requests", str(n),
           "--ttft-slo", str(slo["ttft_slo"]), "--tbt-slo", str(slo["tbt_slo"]),
           "--seed", "0", "--prompt-salt", salt, "--json"]
    if arm in STOCK:
        cmd += ["--endpoint", "openai", "--model", MODEL]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1) or not out.stdout.strip():
        raise RuntimeError(f"{arm} @ {qps} req/s: bench failed: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def verdicts(s: dict[str, Any], tbt_slo: float) -> dict[str, bool]:
    """goodput/token as metrics.meets; tail on its P99-gap part only (bench sees no
    scheduling delay: neither the gateway stream nor an OpenAI server reports it)."""
    p99 = s["tbt_token_p99"]
    return {"goodput": meets(s, "goodput", tbt_slo=tbt_slo),
            "tail_p99": p99 is not None and p99 <= tbt_slo and s["completed"] == s["requests"],
            "token": meets(s, "token", tbt_slo=tbt_slo)}


def capacity(rows: list[dict[str, Any]], crit: str) -> dict[str, Any]:
    """The largest benched rate meeting ``crit``, the next rate up (which misses it), and a
    linear interpolation of the criterion's margin between the two (the capacity).

    On this shared machine a low rate can miss where a higher one meets (another job's
    burst); such rates are listed in ``misses_below`` and do not cap the capacity."""
    rows = sorted(rows, key=lambda r: r["qps"])
    passes = [r for r in rows if r["meets"][crit]]
    lo = passes[-1] if passes else None
    hi = next((r for r in rows if lo is None or r["qps"] > lo["qps"]), None)
    out: dict[str, Any] = {
        "meets_up_to": lo["qps"] if lo else None, "misses_from": hi["qps"] if hi else None,
        "at_sweep_limit": hi is None,
        "misses_below": [r["qps"] for r in rows if lo and r["qps"] < lo["qps"]
                         and not r["meets"][crit]],
    }
    if lo is None or hi is None:
        out["capacity_qps"] = lo["qps"] if lo else 0.0
        return out
    m_lo, m_hi = margin(lo, crit), margin(hi, crit)
    frac = m_lo / (m_lo - m_hi) if m_lo - m_hi > 0 else 0.0
    out["capacity_qps"] = round(lo["qps"] + frac * (hi["qps"] - lo["qps"]), 3)
    return out


def margin(row: dict[str, Any], crit: str) -> float:
    """How far a rate is inside the criterion (≥ 0 met), for interpolation."""
    s, tbt = row["summary"], row["tbt_slo"]
    if crit == "goodput":
        return float(s["goodput_share"] or 0.0) - 0.9
    if crit == "token":
        return float(s["token_criterion_share"] or 0.0) - 0.9
    p99 = s["tbt_token_p99"]
    gap = 1.0 - (p99 / tbt if p99 is not None else float("inf"))
    # the other half of the criterion: every request finished (a refused one misses it)
    return min(gap, float(s["completed"]) / max(1, int(s["requests"])) - 1.0)


KEYS = ("goodput_share", "throughput_tok_s", "ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99",
        "token_criterion_share", "completed", "requests", "duration")


def run_arm(arm: str, args: argparse.Namespace, slo: dict[str, Any], model_dir: Path,
            logs: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    srv = (start_stock(arm, model_dir, slo, logs) if arm in STOCK
           else start_sloserve(arm, args.backend, slo, logs))
    start_s = time.monotonic() - t0
    print(f"{arm}: ready in {start_s:.0f} s", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        if args.warmup:  # at the top rate: the first heavy run after a start is slower
            bench(arm, srv.target, max(args.rates), args.warmup, slo, "warmup")
        for qps in args.rates:
            s = bench(arm, srv.target, qps, args.num_requests, slo, f"rate{qps:g}")
            row = {"qps": qps, "tbt_slo": slo["tbt_slo"], "summary": s,
                   "meets": verdicts(s, slo["tbt_slo"])}
            rows.append(row)
            print(f"{arm:20s} {qps:5.2f} " + " ".join(
                f"{k}={s[k]:.3g}" if isinstance(s[k], float) else f"{k}={s[k]}"
                for k in KEYS) + f" meets={row['meets']}", flush=True)
    finally:
        srv.close()
    return {"start_s": start_s, "rows": rows,
            "capacity": {c: capacity(rows, c) for c in CRITERIA},
            "backend": "stock vllm serve" if arm in STOCK else args.backend}


def acceptance(arms: dict[str, Any]) -> dict[str, Any]:
    """The two bars: best sloserve policy ≥ best stock configuration on goodput, and
    sarathi ≥ 2 × stock vLLM without chunked prefill on tail (its P99 part).

    ``met`` is None (inconclusive) where the side that must be beaten met the criterion at
    the top rate (its capacity is only a lower bound) and ours did not clearly pass it."""
    def cap(arm: str, crit: str) -> tuple[float, bool]:
        c = arms[arm]["capacity"][crit]
        return float(c["capacity_qps"]), bool(c["at_sweep_limit"])

    ours = [a for a in arms if a.startswith("sloserve-")]
    stock = [a for a in arms if a in STOCK]
    out: dict[str, Any] = {}
    if ours and stock:
        best_ours = max(ours, key=lambda a: cap(a, "goodput")[0])
        best_stock = max(stock, key=lambda a: cap(a, "goodput")[0])
        (q_o, lim_o), (q_s, lim_s) = cap(best_ours, "goodput"), cap(best_stock, "goodput")
        met: bool | None = q_o >= q_s
        if lim_s and not lim_o:
            met = False
        elif lim_s:
            met = None  # both met at the top rate: the sweep cannot tell
        out["goodput"] = {"ours": best_ours, "ours_qps": q_o, "ours_lower_bound": lim_o,
                          "stock": best_stock, "stock_qps": q_s, "stock_lower_bound": lim_s,
                          "met": met}
    sarathi = [a for a in SARATHI_ARMS if a in arms]
    if sarathi and "vllm-serve-nochunk" in arms:
        best_sarathi = max(sarathi, key=lambda a: cap(a, "tail_p99")[0])
        (q_o, lim_o), (q_s, lim_s) = cap(best_sarathi, "tail_p99"), cap(
            "vllm-serve-nochunk", "tail_p99")
        tail_met: bool | None = q_o >= 2 * q_s if q_s > 0 else q_o > 0
        if lim_s:
            tail_met = None if lim_o else False
        out["tail"] = {"sarathi": best_sarathi, "sarathi_qps": q_o, "sarathi_lower_bound": lim_o,
                       "stock_nochunk_qps": q_s, "stock_nochunk_lower_bound": lim_s,
                       "ratio": q_o / q_s if q_s else None, "met": tail_met}
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def markdown(result: dict[str, Any]) -> str:
    """The docs tables: every arm and rate, then the capacities on the three criteria."""
    lines = ["| arm | req/s | goodput share | throughput tok/s | TTFT P50 / P99 s | "
             "TBT P50 / P99 s | token share | met G/T/K |", "|---|---|---|---|---|---|---|---|"]
    for arm, res in result["arms"].items():
        for row in sorted(res["rows"], key=lambda r: r["qps"]):
            s, m = row["summary"], row["meets"]
            met = "/".join("y" if m[c] else "n" for c in CRITERIA)
            lines.append(
                f"| {arm} | {row['qps']:g} | {s['goodput_share']:.2f} | "
                f"{_fmt(s['throughput_tok_s'])} | {s['ttft_p50']:.2f} / {s['ttft_p99']:.2f} | "
                f"{s['tbt_p50']:.3f} / {s['tbt_p99']:.3f} | {s['token_criterion_share']:.2f} | "
                f"{met} |")
    lines += ["", "| arm | goodput capacity req/s | tail (P99 gap) capacity req/s | "
              "token capacity req/s | start s |", "|---|---|---|---|---|"]
    for arm, res in result["arms"].items():
        cells = []
        for c in CRITERIA:
            cap = res["capacity"][c]
            if cap["meets_up_to"] is None:
                cells.append(f"< {min(r['qps'] for r in res['rows']):g} (misses at every rate)")
            elif cap["at_sweep_limit"]:
                cells.append(f"≥ {cap['meets_up_to']:g} (met at the top rate)")
            else:
                cells.append(f"{cap['capacity_qps']:.2f} (met {cap['meets_up_to']:g}, "
                             f"missed {cap['misses_from']:g})")
            if cap["misses_below"]:
                cells[-1] += f"; missed at {', '.join(f'{q:g}' for q in cap['misses_below'])}"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {res['start_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--rates", nargs="+", type=float, default=[0.5, 1.0, 1.5, 2.0],
                    help="Poisson arrival rates, req/s (the same for every arm)")
    ap.add_argument("--num-requests", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=16,
                    help="requests sent to each fresh server at the top rate before the sweep, "
                         "not measured (0: none)")
    ap.add_argument("--backend", default="vllm", choices=("vllm", "torch"),
                    help="executor of the sloserve arms")
    ap.add_argument("--dtype", default="float32",
                    help="both sides (this CPU has no bf16 instructions: bf16 prefills ~6x slower)")
    ap.add_argument("--slo-from", default=None,
                    help="JSON with ttft_slo, tbt_slo, token_budget, dtype (skip calibration)")
    ap.add_argument("--calibrate", action="store_true", help="print the scaled SLOs and exit")
    ap.add_argument("--calibrate-side", choices=("stock", "sloserve", "sloserve-eager"),
                    default=None,
                    help=argparse.SUPPRESS)  # child: time the mixed iteration on one side
    ap.add_argument("--measure-lock", default=None,
                    help="calibration: flock this file and run at nice 0 around the timed "
                         "steps only (a shared machine's measurement lock)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--merge", action="store_true",
                    help="keep arms of --out that this run does not repeat")
    ap.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a temp dir)")
    ap.add_argument("--extend", action="store_true",
                    help="like --merge, and add this run's rates to the arms it repeats "
                         "(with --slo-from the earlier SLOs; same workload and seed)")
    ap.add_argument("--rescore", action="store_true",
                    help="recompute the capacities and verdicts of --out and exit")
    ap.add_argument("--table", action="store_true", help="print --out as markdown and exit")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out")
    args = ap.parse_args()
    png = args.out.with_suffix(".png")
    if args.table:
        print(markdown(json.loads(args.out.read_text())))
        return
    if args.rescore:
        res = json.loads(args.out.read_text())
        for arm in res["arms"].values():
            arm["capacity"] = {c: capacity(arm["rows"], c) for c in CRITERIA}
        res["acceptance"] = acceptance(res["arms"])
        args.out.write_text(json.dumps(res, indent=1))
        print(json.dumps(res["acceptance"], indent=1))
        return
    if args.plot_only:
        from vs_vllm_plot import plot

        plot(json.loads(args.out.read_text()), png)
        return
    if args.calibrate_side:
        timed = (time_stock(args.dtype, lock=args.measure_lock)
                 if args.calibrate_side == "stock"
                 else time_ours(args.dtype, enforce_eager=args.calibrate_side.endswith("eager"),
                                lock=args.measure_lock))
        print(json.dumps(timed))
        return
    if args.calibrate:
        print(json.dumps(calibrate(args.dtype, args.measure_lock)))
        return
    from sloserve.services.model_store import resolve

    model_dir = resolve(MODEL)
    t_start = time.time()
    if args.slo_from:
        slo = json.loads(args.slo_from)
    else:  # in children: vLLM's in-process engine leaves threads and memory behind
        slo = calibrate(args.dtype, args.measure_lock)
    print(f"SLOs {slo}", flush=True)
    keep = args.merge or args.extend
    prev = json.loads(args.out.read_text()) if keep and args.out.exists() else {}
    if args.extend and prev and prev["slo"] != slo:
        raise ValueError("--extend: pass the earlier run's SLOs with --slo-from")
    result: dict[str, Any] = {
        "model": MODEL, "trace": TRACE.name, "scale": SCALE, "seed": 0,
        "num_requests": args.num_requests, "slo": slo,
        "rates": sorted(set(args.rates) | set(prev.get("rates", []))) if args.extend
        else args.rates,
        "arms": {k: v for k, v in prev.get("arms", {}).items() if k not in args.arms},
    }
    logs = args.log_dir or Path(tempfile.mkdtemp(prefix="vs_vllm_"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"server logs in {logs}", flush=True)
    for arm in args.arms:
        res = run_arm(arm, args, slo, model_dir, logs)
        if args.extend and arm in prev.get("arms", {}):  # add this run's rates to the arm's
            old = [r for r in prev["arms"][arm]["rows"] if r["qps"] not in args.rates]
            res["rows"] = sorted(old + res["rows"], key=lambda r: r["qps"])
            res["capacity"] = {c: capacity(res["rows"], c) for c in CRITERIA}
            res["start_s_earlier"] = prev["arms"][arm]["start_s"]
        result["arms"][arm] = res
        result["acceptance"] = acceptance(result["arms"])
        result["wall_s"] = time.time() - t_start
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    from vs_vllm_plot import plot

    plot(result, png)
    print(json.dumps(result["acceptance"], indent=1))
    print(f"wrote {args.out} and {png} in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
