"""``sloserve plan``: BestServe's strategy ranking (``sloserve.plan``) as a command."""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from typing import Any

from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.plan.estimator import Efficiency
from sloserve.plan.optimizer import Scenario, SearchConfig, StrategyResult, plan_fast, rank
from sloserve.plan.presets import PRESETS, preset_names, resolve_preset
from sloserve.plan.strategies import COLLOCATED, DISAGG, DISAGGREGATED, enumerate_strategies
from sloserve.policies import BASELINE, PolicyConfig, get_spec, policy_names
from sloserve.policies.flags import add_policy_flags, all_knobs, config_from_args, flag
from sloserve.services.argtypes import number

#: knobs the search itself sets on each strategy, and the flag that sweeps each
SEARCHED = {"max_num_seqs": "--max-batch-sizes", "token_budget": "--token-budgets",
            "max_num_batched_tokens": "the search config"}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers"
                                         ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need integers >= 1, got {text!r}")
    return values


def _efficiency(text: str) -> Efficiency:
    try:
        e_c, e_m, e_plus = (float(v) for v in text.split(","))
        return Efficiency(e_c, e_m, e_plus)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"need e_c,e_m,e_plus in (0, 1], got {text!r} ({exc})"
                                         ) from None


def _policies(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in policy_names()]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"choose from {','.join(policy_names())}; got {text!r}")
    return names


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="rank serving strategies by goodput (BestServe)",
        description="Rank collocated (xm) and disaggregated (ypzd) strategies, TP sizes and "
                    "batch limits by goodput without a GPU (BestServe); --mode accurate re-runs "
                    "the best collocated ones under our policies in the per-iteration simulator.")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", required=True)
    p.add_argument("--gpus", required=True, type=number(int, 1, False), help="GPU budget")
    p.add_argument("--input-len", type=number(int, 1, False), help="fixed prompt tokens")
    p.add_argument("--output-len", type=number(int, 1, False), help="fixed output tokens")
    p.add_argument("--trace", help="vendored trace name (sharegpt, arxiv, ...) or a CSV/JSONL file")
    p.add_argument("--ttft-slo", required=True, type=number(float, 0, True), help="seconds")
    p.add_argument("--tpot-slo", required=True, type=number(float, 0, True), help="seconds")
    p.add_argument("--mode", choices=("fast", "accurate"), default="fast")
    p.add_argument("--top", type=number(int, 1, False), default=10, help="strategies shown")
    p.add_argument("--plot", metavar="FILE.png", help="bar chart of goodput per GPU (Fig. 11)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--tp-sizes", type=_int_list, default=[1, 2, 4, 8])
    p.add_argument("--max-batch-sizes", type=_int_list, default=[32])
    p.add_argument("--architectures", choices=("both", COLLOCATED, DISAGGREGATED),
                   default="both")
    p.add_argument("--num-requests", type=number(int, 1, False), default=1000,
                   help="requests per fast simulation")
    p.add_argument("--rank-by", choices=("per_gpu", "total"), default="per_gpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hardware", default="auto", metavar="PRESET",
                   help=f"Estimator constants: {', '.join(preset_names())} (auto: the preset "
                        "calibrated on --gpu's profiles; ascend-910b3: the paper's)")
    p.add_argument("--extend-upper", action="store_true",
                   help="double Algorithm 8's λ_u = 1.2/T_min while feasible (not in the paper)")
    p.add_argument("--seeds", type=number(int, 1, False), default=1,
                   help="average each P90 over this many seeded workloads (Fig. 10b)")
    p.add_argument("--seq-cap", action="store_true",
                   help="vLLM admission cap in the fast collocated simulator (not in the paper)")
    p.add_argument("--prefill-eff", type=_efficiency, default=None, metavar="E_C,E_M,E_PLUS",
                   help="default: the --hardware preset's")
    p.add_argument("--decode-eff", type=_efficiency, default=None, metavar="E_C,E_M,E_PLUS",
                   help="default: the --hardware preset's")
    p.add_argument("--accurate-top", type=number(int, 1, False), default=5,
                   help="accurate mode: best fast strategies re-evaluated (collocated under "
                        "each of --policies, disaggregated in the per-iteration P/D simulator)")
    p.add_argument("--accurate-requests", type=number(int, 1, False), default=200)
    p.add_argument("--policies", type=_policies, default=policy_names(),
                   help="accurate mode: policies tried on each deployment")
    p.add_argument("--token-budgets", type=_int_list, default=[512, 2048],
                   help="accurate mode: sarathi token budgets tried")
    p.add_argument("--ground-truth", choices=("auto", "estimator"), default="auto",
                   help="accurate mode: real profile where one exists (auto) or the estimator")
    add_policy_flags(p)


def policy_configs(args: argparse.Namespace) -> dict[str, PolicyConfig]:
    """Accurate mode: each of ``--policies`` with the knob flags it has. A knob the
    search sets, or one no chosen policy has, is an error naming the flag."""
    for name in all_knobs():
        if getattr(args, name, None) is None:
            continue
        if name in SEARCHED:
            raise ValueError(f"{flag(name)}: plan searches it ({SEARCHED[name]})")
        if not any(name in get_spec(p).knobs() for p in args.policies):
            raise ValueError(f"{flag(name)}: not a knob of any of --policies {args.policies}")
    return {p: config_from_args(p, args, strict=False) for p in args.policies}


def _scenario(args: argparse.Namespace) -> Scenario:
    fixed = args.input_len is not None or args.output_len is not None
    if fixed == (args.trace is not None):
        raise ValueError("--input-len/--output-len, --trace: give either both lengths or a trace")
    if fixed and (args.input_len is None or args.output_len is None):
        missing = "--output-len" if args.output_len is None else "--input-len"
        raise ValueError(f"{missing}: required together with the other length")
    model, hw = get_model(args.model), get_hardware(args.gpu)
    trace = trace_file = None
    if fixed:
        lengths = [(args.input_len, args.output_len)]
    else:
        from sloserve.workload.traces import load_trace, load_trace_file

        if os.path.exists(args.trace):
            trace_file, records = args.trace, load_trace_file(args.trace)
        else:
            trace, records = args.trace, load_trace(args.trace)
        lengths = [(r.prompt_len, r.output_len) for r in records]
    return Scenario.build(model, hw, args.ttft_slo, args.tpot_slo, lengths, args.num_requests,
                          seed=args.seed, trace=trace, trace_file=trace_file)


def _row(rank_: int, r: StrategyResult, fast: dict[tuple[str, int], float]) -> dict[str, Any]:
    s = r.strategy
    row: dict[str, Any] = {
        "rank": rank_, "name": s.name, "architecture": s.architecture, "policy": s.policy,
        "instances": s.instances, "decode_instances": s.decode_instances,
        "hp_instances": s.hp_instances, "token_budget": s.token_budget, "tp": s.tp,
        "gpus": s.gpus, "max_batch_size": s.max_batch_size,
        "goodput_rps": round(r.goodput_rps, 4), "goodput_per_gpu": round(r.goodput_per_gpu, 4),
        "evaluated_by": r.mode, "simulations": r.evaluations,
    }
    key = (s.name, s.max_batch_size)
    if r.mode == "accurate" and s.policy in (BASELINE, DISAGG) and key in fast:
        row["fast_goodput_rps"] = round(fast[key], 4)
    return row


def _plot(path: str, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.2))
    names = [r["name"] for r in rows]
    x = range(len(rows))
    colours = ["tab:blue" if r["architecture"] == COLLOCATED else "tab:orange" for r in rows]
    ax.bar(x, [r["goodput_per_gpu"] for r in rows], color=colours,
           hatch=None, edgecolor="black", linewidth=0.4)
    fast_x = [i for i, r in enumerate(rows) if "fast_goodput_rps" in r]
    if fast_x:
        fast_y = [rows[i]["fast_goodput_rps"] / rows[i]["gpus"] for i in fast_x]
        ax.scatter(fast_x, fast_y, color="red", marker="_", s=300, zorder=3,
                   label="fast-mode estimate")
        ax.legend()
    ax.set_xticks(list(x), names, rotation=45, ha="right")
    ax.set_ylabel("goodput per GPU (req/s)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    configs = policy_configs(args)
    scenario = _scenario(args)  # validates --gpu first
    try:
        preset = resolve_preset(args.hardware, args.gpu)
    except ValueError as exc:
        raise ValueError(f"--hardware: {str(exc).removeprefix('hardware: ')}") from None
    est_cfg = replace(PRESETS[preset], prefill=args.prefill_eff or PRESETS[preset].prefill,
                      decode=args.decode_eff or PRESETS[preset].decode)
    config = SearchConfig(seq_cap=args.seq_cap, estimator=est_cfg,
                          extend_upper=args.extend_upper, seeds=args.seeds)
    archs = (COLLOCATED, DISAGGREGATED) if args.architectures == "both" else (args.architectures,)
    strategies = enumerate_strategies(scenario.model, scenario.hw, args.gpus,
                                      int(scenario.prompt_lens.max() + scenario.output_lens.max()),
                                      args.tp_sizes, args.max_batch_sizes, archs)
    if not strategies:
        raise ValueError(f"--gpus: no strategy fits {scenario.model.name} on {args.gpus} "
                         f"x {scenario.hw.name} with TP sizes {args.tp_sizes}")
    results = plan_fast(scenario, strategies, config, args.rank_by)
    fast = {(r.strategy.name, r.strategy.max_batch_size): r.goodput_rps for r in results}
    timing = "bestserve-estimator"
    if args.mode == "accurate":
        from sloserve.plan.accurate import AccurateEvaluator, plan_accurate

        ev = AccurateEvaluator(scenario, config, args.accurate_requests, args.ground_truth,
                               configs)
        accurate = plan_accurate(results, ev, args.accurate_top, args.policies,
                                 args.token_budgets)
        timing = ", ".join(sorted({ev.timing_name(r.strategy.tp) for r in accurate}))
        results = rank(accurate, args.rank_by)
    multi_batch = len(set(args.max_batch_sizes)) > 1
    rows = [_row(i + 1, r, fast) for i, r in enumerate(results[: args.top])]
    if multi_batch:
        for row in rows:
            row["name"] += f"-b{row['max_batch_size']}"
    out = {
        "model": scenario.model.name, "gpu": scenario.hw.name, "gpus": args.gpus,
        "mode": args.mode,
        "workload": {"input_len": args.input_len, "output_len": args.output_len,
                     "trace": args.trace, "num_requests": args.num_requests},
        "ttft_slo": args.ttft_slo, "tpot_slo": args.tpot_slo,
        "hardware_preset": preset,
        "efficiency": {"prefill": list(_eff(est_cfg.prefill)),
                       "decode": list(_eff(est_cfg.decode))},
        "dispatch_ms": {"rmsnorm": est_cfg.dispatch_rmsnorm * 1e3,
                        "attention": est_cfg.dispatch_attention * 1e3,
                        "mlp": est_cfg.dispatch_mlp * 1e3},
        "allreduce_floor_ms": est_cfg.allreduce_floor * 1e3,
        "upper_bound": "doubled while feasible" if args.extend_upper else "1.2/T_min (paper)",
        "seeds": args.seeds,
        "cost_model": timing,
        "strategies_evaluated": len(results), "strategies": rows,
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }
    if args.plot:
        _plot(args.plot, rows, f"{scenario.model.name} on {args.gpus}x {scenario.hw.name} "
                               f"({args.mode} mode)")
    if args.json:
        print(json.dumps(out))
    else:
        _print_table(out)
    return 0


def _eff(e: Efficiency) -> tuple[float, float, float]:
    return e.e_c, e.e_m, e.e_plus


def _print_table(out: dict[str, Any]) -> None:
    print(f"{out['model']} on {out['gpus']} x {out['gpu']}, {out['mode']} mode, "
          f"SLO TTFT {out['ttft_slo']} s / TPOT {out['tpot_slo']} s (P90), "
          f"cost model: {out['cost_model']} ({out['hardware_preset']} constants), "
          f"λ_u: {out['upper_bound']}")
    print(f"{'rank':>4}  {'strategy':<28} {'arch':<13} {'gpus':>4} {'batch':>5} "
          f"{'goodput':>9} {'per GPU':>8}  by")
    for r in out["strategies"]:
        print(f"{r['rank']:>4}  {r['name']:<28} {r['architecture']:<13} {r['gpus']:>4} "
              f"{r['max_batch_size']:>5} {r['goodput_rps']:>9.3f} {r['goodput_per_gpu']:>8.3f}  "
              f"{r['evaluated_by']}")
    print(f"{out['strategies_evaluated']} strategies evaluated in {out['elapsed_s']:.1f} s "
          "(goodput in requests/s)")
