"""``sloserve bench``: replay a workload against a running gateway through the SDK.

``--endpoint openai`` replays the same workload against any OpenAI-compatible
server instead (stock ``vllm serve``): ``bench_openai``.

The workload is built exactly as ``sloserve simulate`` builds it (same trace,
seed, arrivals and SLOs), each request is sent at its arrival offset with a
prompt of its exact token length, and the measured token times (the
gateway's clock, docs/design.md: TTFT from arrival at the gateway) go through the
same ``sloserve.metrics.summarize``, so the JSON keys match ``simulate``'s.

On top, ``vllm bench serve``'s conventions (``bench_metrics``, ``bench_report``):
its metric names and semantics (``--goodput ttft:MS tpot:MS e2el:MS``,
``--percentile-metrics``, ``--metric-percentiles``), its printed block, a
result file (``--result-file``), several rates in one run (``--qps 1 2 4``, alias
``--request-rate``), a tqdm bar on a terminal and ``--plot DIR``. Both
endpoints go through ``result()``, so their keys are the same.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sloserve.defaults import GPU, HETERO_TBT_SLO, TBT_SLO, TTFT_SLO, workload_slos
from sloserve.request import Request, RequestStatus
from sloserve.services.bench_metrics import (
    DEFAULT_PERCENTILES,
    PERCENTILE_METRICS,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    per_request,
    timing,
    vllm_metrics,
)
from sloserve.services.compare_sim import LiveTimings


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="replay a workload against a running gateway")
    p.add_argument("--endpoint", choices=("grpc", "openai"), default="grpc",
                   help="grpc: our gateway (default); openai: any OpenAI-compatible server")
    p.add_argument("--target", default="127.0.0.1:50051",
                   help="gateway address (grpc) or http://HOST:PORT (openai)")
    p.add_argument("--model", default=None,
                   help="openai: served model name (default: the first of GET /v1/models)")
    p.add_argument("--workload-model", default=None,
                   help="openai: model preset whose max context caps the workload "
                        "(default: the served name)")
    p.add_argument("--gpu", default=GPU,
                   help="openai: hardware whose profile scales a --slo-mix hetero workload")
    p.add_argument("--temperature", type=float, default=0.0, help="openai: sampling temperature")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="sharegpt | arxiv | bwb | azure-conv | azure-code")
    src.add_argument("--trace-file", help="CSV/JSONL with prompt and output token columns")
    p.add_argument("--qps", "--request-rate", dest="qps", type=float, nargs="+", required=True,
                   metavar="RATE", help="request rate(s) in req/s; several run one after another")
    p.add_argument("--num-requests", type=int, required=True)
    p.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="vllm bench serve's goodput targets: ttft:MS tpot:MS e2el:MS "
                        "(judged by the client; the requests carry --ttft-slo/--tbt-slo)")
    p.add_argument("--percentile-metrics", default=",".join(PERCENTILE_METRICS),
                   help="comma-separated subset of ttft,tpot,itl,e2el to report")
    p.add_argument("--metric-percentiles", default=DEFAULT_PERCENTILES,
                   help='comma-separated percentiles, e.g. "50,90,99" (default 99)')
    p.add_argument("--result-file", "--result-filename", dest="result_file", default=None,
                   help="write the result JSON here (one line per rate, per-request arrays)")
    p.add_argument("--plot", default=None, metavar="DIR",
                   help="write TTFT/ITL CDF PNGs (and goodput vs rate for several rates) "
                        "into DIR (needs matplotlib: the bench extra)")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    p.add_argument("--ttft-slo", type=float, default=None,
                   help=f"seconds (default {TTFT_SLO}; with --slo-mix hetero: the anchor that "
                        "replaces each length group's prefill latency, which is the default)")
    p.add_argument("--tbt-slo", type=float, default=None,
                   help=f"seconds (default {TBT_SLO}; with --slo-mix hetero: {HETERO_TBT_SLO})")
    p.add_argument("--slo-mix", choices=("hetero",), default=None)
    p.add_argument("--jct-share", type=float, default=0.0,
                   help="with --slo-mix hetero: share of offline JCT-SLO requests (AccelGen §4.3)")
    p.add_argument("--arrival", choices=("poisson", "gamma", "trace"), default="poisson")
    p.add_argument("--cv", type=float, default=1.0)
    p.add_argument("--sample", choices=("random", "ordered"), default=None,
                   help="trace rows drawn at random, or consecutive in the trace's own order "
                        "(conversations kept in order); default: ordered for a trace with "
                        "session or prefix identity, else random (as simulate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-salt", default="",
                   help="prefix every request id (and so its prompt token ids) with this: the "
                        "same workload with other prompts, e.g. one salt per rate, so a server "
                        "with prefix caching does not find an earlier run's prompts cached")
    p.add_argument("--json", action="store_true")
    p.add_argument("--compare-sim", action="store_true",
                   help="after each rate, simulate the same workload (seed, rate, SLOs) on the "
                        "deployment the stack reports (Info + each scheduler's Status) and print "
                        "live vs sim per metric (key compare_sim; grpc endpoint only)")
    p.add_argument("--overhead-profile", default=None, metavar="FILE",
                   help="with --compare-sim: the simulator's ground truth includes this measured "
                        "overhead profile (simulate --overhead-profile)")
    p.add_argument("--overhead-out", default=None, metavar="FILE",
                   help="after the run, save the gaps between batches the stack's schedulers "
                        "measured (Status) as an overhead profile for simulate (grpc only)")


def workload(args: argparse.Namespace, model: str, gpu: str) -> list[Request]:
    """The requests ``sloserve simulate`` would generate for the same flags (a hetero
    SLO mix scales TTFT SLOs by the served GPU's profiled prompt latencies, as simulate)."""
    return workload_rows(args, model, gpu)[0]


def workload_rows(args: argparse.Namespace, model: str,
                  gpu: str) -> tuple[list[Request], int]:
    """``workload``'s requests and how many trace rows were dropped as too long for the
    model's context (reported by every command, issue 38)."""
    from sloserve.perf.models import get_model
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import build_timing, build_workload

    ttft, tbt = workload_slos(args.ttft_slo, args.tbt_slo, args.slo_mix)
    cfg = SimConfig(
        policy="sarathi", model=model, trace=args.trace, trace_file=args.trace_file,
        qps=args.qps, num_requests=args.num_requests, ttft_slo=ttft, tbt_slo=tbt,
        slo_mix=args.slo_mix, jct_share=args.jct_share, arrival=args.arrival, cv=args.cv,
        sample=getattr(args, "sample", None), seed=args.seed, gpu=gpu,
    )
    cfg.validate()
    timing = build_timing(cfg) if args.slo_mix else None
    w = build_workload(cfg, get_model(model), timing)  # type: ignore[arg-type,unused-ignore]
    reqs: list[Request] = w.requests
    salt = getattr(args, "prompt_salt", "")
    if salt:
        for r in reqs:
            r.request_id = f"{salt}:{r.request_id}"
    return reqs, w.num_too_long


def prompt_ids(req: Request) -> list[int]:
    """A prompt of exactly ``prompt_len`` byte-level tokens (printable ASCII), drawn from a
    generator seeded by the request id: deterministic, and distinct requests share no
    prefix, so a server with prefix caching (stock vLLM's default) gets no hits that the
    trace's real prompts would not give it. A request with a prefix identity (``hash_ids``,
    the multi-turn workload's) gets one block of ``PREFIX_UNIT`` tokens per id instead, so
    requests share exactly the prefixes their ids say (issue 33, item 4)."""
    if req.hash_ids:
        ids = [t for h in req.hash_ids for t in _unit_tokens(h)]
        if len(ids) >= req.prompt_len:
            return ids[:req.prompt_len]
    rng = random.Random(req.request_id)
    return [rng.randrange(32, 127) for _ in range(req.prompt_len)]


@functools.lru_cache(maxsize=4096)
def _unit_tokens(hash_id: int) -> tuple[int, ...]:
    """The ``PREFIX_UNIT`` tokens a prefix id names (printable ASCII, seeded by the id)."""
    from sloserve.kv_prefix import PREFIX_UNIT

    rng = random.Random(hash_id)
    return tuple(rng.randrange(32, 127) for _ in range(PREFIX_UNIT))


async def _one(client: Any, req: Request, t0: float, bar: Any,
               probe: LiveTimings | None = None) -> None:
    from sloserve.client import RequestDropped, SloserveError

    offset = req.arrival_time
    if probe is not None:
        probe.arrivals[req.request_id] = offset  # until the gateway's stamp replaces it
    await asyncio.sleep(max(0.0, t0 + offset - time.monotonic()))
    # provisional, on the wall clock the gateway's times use: a request dropped or failed
    # before its first chunk keeps it (not the workload's offset, which made `duration`
    # last finish - 0, decades long); the first chunk replaces it with the gateway's
    req.arrival_time = time.time()
    try:
        async for c in client.generate(
            prompt_token_ids=prompt_ids(req), max_tokens=req.output_len, ttft_slo=req.slo.ttft,
            tbt_slo=req.slo.tbt, jct_slo=req.slo.jct, priority=req.priority,
            ignore_eos=True,  # exact output lengths, as simulate (vllm bench --ignore-eos)
        ):
            req.arrival_time = c.arrival_time
            req.token_times.append(c.time)
            if probe is not None:
                if c.index == 0:
                    probe.arrival_lag_s.append(c.arrival_time - probe.wall_t0 - offset)
                    probe.arrivals[req.request_id] = c.arrival_time - probe.wall_t0
                if c.produced_time:
                    probe.delivery_lag_s.append(c.time - c.produced_time)
                    probe.produced.setdefault(req.request_id, []).append(c.produced_time)
            req.num_generated = c.index + 1
            req.num_offloads = c.num_offloads
            if c.finish_reason:
                req.status, req.finish_time = RequestStatus.FINISHED, c.time
    except RequestDropped:
        req.status, req.finish_time = RequestStatus.DROPPED, time.time()
    except SloserveError as exc:
        print(f"request {req.request_id}: {exc.code.name}: {exc.details}", file=sys.stderr)
    if bar is not None:
        bar.update(1)


async def send_all(reqs: list[Request], one: Callable[[Request, float, Any], Awaitable[None]],
                   progress: bool = True, label: str = "",
                   probe: LiveTimings | None = None) -> None:
    """Send every request at its arrival offset (``one(req, t0, bar)``), a tqdm bar on a
    terminal unless ``progress`` is off; the measured times replace the workload's
    synthetic ones."""
    for r in reqs:
        r.token_times, r.status, r.num_generated = [], RequestStatus.WAITING, 0
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(reqs), unit="req", file=sys.stderr, desc=label or None)
    t0 = time.monotonic()
    if probe is not None:
        probe.wall_t0 = time.time() - (time.monotonic() - t0)
    await asyncio.gather(*(one(r, t0, bar) for r in reqs))
    if bar is not None:
        bar.close()


def progress(args: argparse.Namespace) -> tuple[bool, str]:
    """``send_all``'s bar settings for one rate."""
    return not getattr(args, "disable_tqdm", False), f"{args.qps:g} req/s"


def result(reqs: list[Request], args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """One rate's result, the same keys for every endpoint: ``summarize``'s (our SLO
    metrics), vLLM's (``bench_metrics``), ``extra`` (who served it), and vLLM's
    per-request arrays (dropped from ``--json``)."""
    from sloserve.metrics import summarize

    out: dict[str, Any] = dict(summarize(reqs))
    timings = [timing(r) for r in reqs]
    out.update(vllm_metrics(timings, out["duration"], parse_goodput(args.goodput),
                            parse_percentile_metrics(args.percentile_metrics),
                            parse_metric_percentiles(args.metric_percentiles)))
    out.update(extra, qps=args.qps, request_rate=args.qps, seed=args.seed, measured=True)
    out.update(per_request(timings))
    return out


async def replay(target: str, args: argparse.Namespace) -> dict[str, Any]:
    """One rate (``args.qps`` a number, ``at_rate``) against our gRPC gateway."""
    from sloserve.client import AsyncClient
    from sloserve.services import compare_sim

    want_cmp = getattr(args, "compare_sim", False)
    want_out = getattr(args, "overhead_out", None)
    probe = compare_sim.LiveTimings() if want_cmp or want_out else None
    async with AsyncClient(target) as client:
        info = await client.info()
        reqs, too_long = workload_rows(args, info["model"], info["instances"][0]["hardware"])
        await send_all(reqs, lambda r, t0, bar: _one(client, r, t0, bar, probe),
                       *progress(args), probe=probe)
    if probe is not None:
        probe.after_run(reqs)
    out = result(reqs, args, policy=",".join(info["policies"]), too_long=too_long,
                 instances=len(info["instances"]), model=info["model"],
                 offloads=sum(r.num_offloads for r in reqs), endpoint="grpc", target=target)
    if want_cmp or want_out:
        sts = await compare_sim.statuses(info, samples=bool(want_out))
        if want_out:
            compare_sim.overhead_profile(sts, info["instances"][0]["backend"], {
                "command": "sloserve bench", "target": target, "trace": args.trace,
                "qps": args.qps, "num_requests": args.num_requests, "seed": args.seed,
                "load_avg_1m": os.getloadavg()[0],
            }, probe.delivery_lag_s if probe is not None else None).save(want_out)
        if want_cmp:
            out["compare_sim"] = compare_sim.compare(out, args, info, sts, probe)
    return out


def at_rate(args: argparse.Namespace, rate: float) -> argparse.Namespace:
    """``args`` for one of the ``--qps`` rates."""
    return argparse.Namespace(**{**vars(args), "qps": rate})


def check(args: argparse.Namespace) -> list[float]:
    """Every flag ``run`` judges itself, before anything is sent; returns the rates."""
    rates = list(args.qps) if isinstance(args.qps, list) else [args.qps]
    for q in rates:
        if not (q > 0 and q != float("inf")):
            raise ValueError(f"qps (--qps/--request-rate): every rate must be a finite number "
                             f"> 0, got {q}")
    if args.num_requests < 1:
        raise ValueError(f"num_requests (--num-requests): must be >= 1, got {args.num_requests}")
    if args.endpoint != "grpc" and (getattr(args, "compare_sim", False)
                                    or getattr(args, "overhead_out", None)):
        raise ValueError("compare_sim (--compare-sim, --overhead-out): reads the stack's own "
                         "Status, so --endpoint grpc only")
    if getattr(args, "overhead_profile", None) and not getattr(args, "compare_sim", False):
        raise ValueError("overhead_profile (--overhead-profile): only with --compare-sim")
    if getattr(args, "overhead_profile", None):
        from sloserve.sim.overhead import OverheadProfile

        OverheadProfile.load(args.overhead_profile)  # a bad file fails before anything is sent
    parse_goodput(args.goodput)
    parse_percentile_metrics(args.percentile_metrics)
    parse_metric_percentiles(args.metric_percentiles)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("plot (--plot): needs matplotlib "
                             "(pip install 'sloserve[bench]')") from None
    return rates


def run(args: argparse.Namespace) -> int:
    from sloserve.metrics import format_table
    from sloserve.services import bench_report

    results = []
    for rate in check(args):
        one = at_rate(args, rate)
        if args.endpoint == "openai":
            from sloserve.services import bench_openai

            out = asyncio.run(bench_openai.replay(one))
        else:
            out = asyncio.run(replay(args.target, one))
        results.append(out)
        if args.json:
            print(json.dumps(bench_report.scalars(out)), flush=True)
        else:
            print(bench_report.format_vllm(out))
            print(format_table(bench_report.ours(out)), flush=True)
            if "compare_sim" in out:
                from sloserve.services.compare_sim import format_comparison

                print(format_comparison(out["compare_sim"]), flush=True)
    if args.result_file:
        bench_report.write_results(args.result_file, results)
    if args.plot:
        for path in bench_report.plot(args.plot, results):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(o["completed"] + o["dropped"] == o["requests"] for o in results) else 1
