"""``sloserve simulate`` and ``sloserve capacity``: thin shells over ``sloserve.sim``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sloserve.defaults import HETERO_TBT_SLO, workload_slos
from sloserve.deployment import Deployment
from sloserve.metrics import MAX_DROP_SHARE
from sloserve.policies import compared_names, get_spec
from sloserve.policies.flags import add_policy_flags
from sloserve.policies.flags import config_from_args as policy_config_from_args
from sloserve.services import admission_flags, deployment_flags
from sloserve.services.argtypes import positive
from sloserve.sim.config import SimConfig

SIM_FIELDS = ("policy", "instances", "hp_instances", "model", "gpu", "tp", "num_blocks",
              "prefix_caching", "prefix_routing", "overlap", "refit_interval", "perf_model",
              "ttft_slo", "tbt_slo", "seed", "noise_cv")  # the Deployment's flags here


def _common(p: argparse.ArgumentParser, compare: bool = False) -> None:
    deployment_flags.add_flags(
        p, SIM_FIELDS if not compare else SIM_FIELDS[1:],
        defaults={"instances": 3} if compare else None, required=() if compare else ("policy",))
    src = p.add_mutually_exclusive_group(required=not compare)
    src.add_argument("--trace", help="sharegpt | arxiv | bwb | azure-conv | azure-code | "
                                     "multiturn (synthetic chats with shared prefixes)")
    src.add_argument("--trace-file", help="CSV/JSONL with prompt and output token columns "
                                          "(and Mooncake hash_ids for prefix caching)")
    p.add_argument("--num-requests", type=positive(int), default=1000)
    p.add_argument("--slo-mix", choices=("hetero",), default=None,
                   help="per-request SLOs drawn as AccelGen §3/§6.1 do (then --ttft-slo "
                        "defaults to each length group's prefill latency and --tbt-slo to "
                        f"{HETERO_TBT_SLO})")
    p.add_argument("--jct-share", type=float, default=0.0,
                   help="with --slo-mix hetero: share of offline requests that carry only a "
                        "JCT SLO (AccelGen §4.3; default 0)")
    p.add_argument("--arrival", choices=("poisson", "gamma", "trace"), default="poisson")
    p.add_argument("--cv", type=positive(float), default=1.0, help="gamma arrivals' CV")
    p.add_argument("--sample", choices=("random", "ordered"), default=None,
                   help="trace rows drawn at random, or consecutive in the trace's own order "
                        "(conversations kept in order); default: ordered for a trace with "
                        "session or prefix identity, else random")
    p.add_argument("--noise-streams", choices=("run", "instance"), default="run",
                   help="run: every batch's noise from one stream in global batch order "
                        "(default); instance: one stream per instance, as the live stack's "
                        "sim executors draw it (--workers needs it when --noise-cv > 0)")
    p.add_argument("--noise-seed", type=int, default=None,
                   help="the ground truth's seed (noise, profiling sweep; default --seed): "
                        "a live stack's `up --seed`, to replay its draws")
    p.add_argument("--workers", type=positive(int), default=1,
                   help="processes: the instances split into this many groups, results "
                        "merged; only where exact (round-robin routing, no HP, no policy "
                        "reading the online perf model: docs/lab/beyond.md), else refused")
    p.add_argument("--timing-profile", default=None,
                   help="ground truth from `sloserve profile --out FILE` samples")
    p.add_argument("--overhead-profile", default=None, metavar="FILE",
                   help="the live stack's measured gap between batches as part of the ground "
                        "truth (`sloserve bench --overhead-out FILE`; docs/lab/live-stack.md)")
    p.add_argument("--controller-lag", action="store_true",
                   help="with --overhead-profile: each instance's report (first tokens, queue "
                        "state) reaches the controller after the gateway's measured delivery "
                        "lag, as live (HP tickets freed later; docs/lab/live-stack.md)")
    p.add_argument("--prefix-cache-outputs", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="prefix caching shares the blocks a request's answer fills too "
                        "(vLLM's; default); --no-prefix-cache-outputs: only its prompt's, as "
                        "the live stack (bench --compare-sim; docs/serve.md)")
    p.add_argument("--metrics", choices=("exact", "stream"), default="exact",
                   help="stream: constant memory per request, percentiles within 0.1 %% "
                        "(a sketch); counts, shares and goodput stay exact (default exact)")
    p.add_argument("--json", action="store_true")
    admission_flags.add_flags(p)
    add_policy_flags(p)


def add_parser(sub: Any) -> None:
    sim = sub.add_parser("simulate", help="simulate one policy on one workload")
    _common(sim)
    sim.add_argument("--qps", type=positive(float), required=True)
    sim.add_argument("--noise-draws", type=positive(int), default=1, metavar="K",
                     help="simulate K draws of the ground truth's noise (seeds --noise-seed "
                          ".. +K-1) and report each varying metric's median, with its range "
                          "in noise_draws (default 1: one simulation)")
    cap = sub.add_parser("capacity", help="largest arrival rate meeting a criterion")
    _common(cap)
    cap.add_argument("--target", type=positive(float), default=0.9)
    cap.add_argument("--criterion", choices=("goodput", "tail", "token"), default="goodput")
    cap.add_argument("--qps-start", type=positive(float), default=1.0)
    cap.add_argument("--max-drop-share", type=float, default=MAX_DROP_SHARE, metavar="SHARE",
                     help="tail criterion: a rate dropping (or shedding) a larger share of its "
                          f"requests fails (default {MAX_DROP_SHARE}; docs/workloads-and-"
                          "metrics.md)")
    cmp = sub.add_parser("compare", help="every policy on the same workload, side by side")
    _common(cmp, compare=True)
    cmp.add_argument("--qps", type=positive(float), default=8.0,
                     help="whole-deployment rate (default near 3 A100s' capacity)")
    cmp.add_argument("--baselines", action="store_true",
                     help="also the baselines and references the papers compare against "
                          "(orca, oracle), labelled; not policies a user would pick")
    cmp.set_defaults(trace="sharegpt", policy="sarathi")


def config_from_args(args: argparse.Namespace, qps: float = 1.0,
                     strict: bool = True) -> SimConfig:
    """The Deployment the flags set (every other field its one default) + the workload."""
    ttft, tbt = workload_slos(args.ttft_slo, args.tbt_slo, args.slo_mix)
    dep = deployment_flags.deployment_from_args(
        args, Deployment(), policy_config=policy_config_from_args(args.policy, args,
                                                                  strict=strict))
    cfg = SimConfig(
        **deployment_flags.field_values(dep, ttft_slo=ttft, tbt_slo=tbt,
                                        admission=admission_flags.limits_from_args(args)),
        trace=args.trace, trace_file=args.trace_file,
        qps=qps, num_requests=args.num_requests,
        slo_mix=args.slo_mix, jct_share=args.jct_share, arrival=args.arrival, cv=args.cv,
        sample=args.sample, noise_streams=args.noise_streams, noise_seed=args.noise_seed,
        workers=args.workers,
        timing_profile=args.timing_profile, metrics=args.metrics,
        overhead_profile=args.overhead_profile, controller_lag=args.controller_lag,
        prefix_cache_outputs=args.prefix_cache_outputs,
    )
    cfg.validate()
    return cfg


def run(args: argparse.Namespace) -> int:
    from sloserve.metrics import format_table, format_value
    from sloserve.sim.capacity import find_capacity
    from sloserve.sim.draws import simulate_draws
    from sloserve.sim.simulator import simulate
    from sloserve.workload.traces import TraceError

    if args.command == "compare":
        return _compare(args)
    try:
        if args.command == "simulate":
            cfg = config_from_args(args, args.qps)
            out = simulate_draws(cfg, args.noise_draws) if args.noise_draws > 1 else simulate(cfg)
        else:
            out = find_capacity(config_from_args(args), args.criterion, args.target,
                                qps_start=args.qps_start, max_drop_share=args.max_drop_share)
    except TraceError as exc:
        print(f"sloserve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_clean(out), allow_nan=False))
    elif args.command == "simulate":
        draws = out.pop("noise_draws", None)
        print(format_table(out))
        if draws:
            print(f"medians of {draws['draws']} noise draws (seeds {draws['noise_seeds'][0]}.."
                  f"{draws['noise_seeds'][-1]}); ranges:")
            width = max(len(k) for k in draws["range"])
            for k, (lo, hi) in draws["range"].items():
                print(f"  {k:<{width}}  {format_value(k, lo)} .. {format_value(k, hi)}")
    else:
        rule = (f"drops counted, <= {out['max_drop_share']:g} dropped"
                if out["criterion"] == "tail" else f">= target {out['target']}")
        at = out["at_capacity"] or {}
        served = "" if not at else (
            f" (offered {format_value('offered_rps', at['offered_rps'])}, served "
            f"{format_value('served_rps', at['served_rps'])}, dropped {at['dropped']}, "
            f"too long {at['too_long']})")
        print(f"capacity ({out['criterion']}, {rule}): {out['capacity_qps']} req/s{served}")
        for p in out["probes"]:
            print(f"  qps {p['qps']:8.3f}  offered {format_value('offered_rps', p['offered_rps'])}"
                  f"  goodput {format_value('goodput_share', p['goodput_share'])}  "
                  f"tbt_p99 {format_value('tbt_token_p99', p['tbt_token_p99'])}  "
                  f"sched_delay_p50_all {format_value('sched_delay_p50', p['sched_delay_p50_all'])}"
                  f"  dropped {p['dropped']} ({format_value('drop_share', p['drop_share'])})  "
                  f"too long {p['too_long']}  {'ok' if p['meets'] else 'miss'}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Same seed, workload and GPUs for every policy; one with an HP role splits them
    (``PolicySpec.default_hp``). A knob flag goes to the policies that have it."""
    from sloserve.metrics import format_value
    from sloserve.sim.simulator import simulate

    rows, cfg = [], None
    if args.trace_file is not None:  # the sharegpt default is for no source given
        args.trace = None
    for policy in compared_names(baselines=args.baselines):
        spec = get_spec(policy)
        args.policy = policy
        args.hp_instances = spec.default_hp(args.instances)
        if spec.has_role("hp") and args.hp_instances == 0:
            continue  # too few instances to split
        cfg = config_from_args(args, args.qps, strict=False)
        rows.append(simulate(cfg))
    assert cfg is not None
    if args.json:
        print(json.dumps(_clean(rows), allow_nan=False))
        return 0
    cols = ("policy", "instances", "goodput_share", "ttft_p50", "ttft_p99", "tbt_token_p99",
            "mean_tbt_p99", "token_criterion_share", "dropped", "drop_share", "served_rps",
            "throughput_tok_s", "preemptions", "sim_wall_s")
    slos = "hetero SLOs" if cfg.slo_mix else f"TTFT SLO {cfg.ttft_slo}s, TBT SLO {cfg.tbt_slo}s"
    first = rows[0]
    print(f"{args.num_requests} requests, {args.trace or args.trace_file}, {args.qps} req/s "
          f"asked, {format_value('offered_rps', first.get('offered_rps'))} offered, "
          f"{first.get('too_long')} trace rows too long for the context dropped, "
          f"{cfg.instances} x {cfg.model} on {cfg.gpu}, {slos}")
    print("  ".join(f"{c:>14}" for c in cols))
    for r in rows:
        cells = [r.get(c) for c in cols]
        line = "  ".join(f"{v:>14.4g}" if isinstance(v, float) else f"{v!s:>14}" for v in cells)
        print(line + (f"  ({label})" if (label := get_spec(r["policy"]).baseline) else ""))
    print(COMPARE_LEGEND)
    return 0


COMPARE_LEGEND = (
    "legend: rows are the policies to choose between (--baselines adds the papers' "
    "baselines, labelled); goodput_share = requests meeting every SLO (the figure to "
    "compare); ttft_* = time to first token, s; tbt_token_p99 = P99 gap between tokens, s; "
    "mean_tbt_p99 = P99 of each request's mean gap, s; token_criterion_share = tokens on "
    "time; dropped, drop_share = requests a policy refused or gave up (misses); served_rps = "
    "completed requests/s; throughput_tok_s = tokens/s; sim_wall_s = the simulator's own "
    "time (docs/simulate.md)")


def _clean(x: Any) -> Any:
    """NaN -> null, recursively, so the JSON stays valid."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
