"""Issue 13 items 2-3: capacity of ``slack`` vs the best seed policy, the oracle and the bound.

Usage: python infra/experiments/beyond_capacity.py [--num-requests K] [--jobs J]
       [--only SUBSTR] [--traces a,b] [--instances 1,3] [--slos tbt0.1,tbt0.5,hetero]
       [--seeds vllm,sarathi,...] [--refs oracle] [--variants defer,drop,serve]
       [slack's knob flags, e.g. --late-max-running 64 --late-in-budget]
       [--qps-max-factor F] [--resume] [--out FILE.json]

Grid (llama-3-8b on a100): traces x instances x SLOs x policies. SLOs: uniform
TTFT 1 s with TBT 0.1 s or 0.5 s, or AccelGen's heterogeneous mix. Seeds
(``--seeds``; default every registered policy but ``slack`` and the references):
``ascendra`` runs with its default HP share (2L1H on three instances) and, on one
instance, as 1L0H: its LP scheduler alone (EDF value function, its token budget,
nothing to offload to). References (``--refs``, default ``oracle``, the SRPT
policy that knows output lengths) are reported beside ours, not counted as seeds.
Ours is ``slack`` with its defaults (``late='triage'``); ``--variants
defer,drop,serve`` adds ``slack-<mode>`` (``late=<mode>``) for comparison, never
counted as ours.

Criteria (docs/lab/beyond.md "How the cells are judged"):

* ``goodput``: goodput share >= 0.9 on the uniform cells; on the heterogeneous
  cells >= 0.9 x the *feasible share* (requests whose TTFT SLO covers their
  whole prompt's prefill alone on the noiseless ground truth, and whose TBT SLO
  covers one decode alone): AccelGen's mix makes ~half the requests infeasible
  for any scheduler, so a 0.9 target ranks nothing.
* ``tail`` and ``token``: the core's one definition (``sloserve.metrics.meets``, issue
  38), as ``sloserve capacity`` judges them: ``tail`` is Sarathi-Serve §5.1's pooled P99
  TBT <= SLO and median scheduling delay <= 2 s with a dropped or never-scheduled request
  counted as an infinite delay, and at most 1 % of the requests dropped. (Grids before
  issue 38 also kept ``tail_scheduled``, the median over scheduled requests alone, and
  judged ``tail`` without the drop bound.)
* ``token``: token-criterion share >= 0.9.

Each setup's simulations are shared by the criteria; every probe's summary
(shares, drops, both scheduling-delay medians, TTFT percentiles) is kept in the
JSON. Per cell the bound is ``sloserve.sim.bound`` at the cell's goodput target.
The JSON is rewritten after every finished setup, so a cut-short run keeps what
it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from sloserve.batch import BatchShape
from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.models import get_model
from sloserve.policies import get_spec, policy_names
from sloserve.policies.flags import add_policy_flags, config_from_args
from sloserve.policies.slack import SlackConfig
from sloserve.sim.bound import goodput_bound
from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import build_timing, build_workload, simulate

CRITERIA = ("goodput", "tail", "token")
OURS = "slack"
VARIANTS = ("defer", "drop", "serve")  # slack-<late mode>, for comparison
REFS = ("oracle",)
TRACES = ("sharegpt", "arxiv", "azure-conv", "azure-code")
SLOS: dict[str, dict[str, Any]] = {
    "tbt0.1": {"ttft_slo": 1.0, "tbt_slo": 0.1},
    "tbt0.5": {"ttft_slo": 1.0, "tbt_slo": 0.5},
    "hetero": {"ttft_slo": None, "tbt_slo": 0.1875, "slo_mix": "hetero"},
}
TARGET = 0.9
PROBE_KEYS = ("goodput_share", "token_criterion_share", "tbt_token_p99", "sched_delay_p50",
              "sched_delay_p50_all", "dropped", "drop_share", "too_long", "offered_rps",
              "served_rps", "ttft_p50", "ttft_p90", "ttft_p99")


def cell_name(trace: str, instances: int, slo: str) -> str:
    return f"{trace}/x{instances}/{slo}"


def setups(k: int, traces: list[str], instances: list[int], slos: list[str],
           seeds: list[str], refs: list[str], variants: list[str] | None = None,
           ours_config: SlackConfig | None = None, seed: int = 0
           ) -> list[tuple[str, str, SimConfig]]:
    out = []
    ours = [OURS, *(f"{OURS}-{v}" for v in variants or [])]
    for slo in slos:  # the uniform cells first, so a cut-short run holds them
        for n in instances:
            for trace in traces:
                for label in [*ours, *seeds, *refs]:
                    mode = label.removeprefix(f"{OURS}-") if label.startswith(f"{OURS}-") else None
                    p = OURS if mode else label
                    hp = get_spec(p).default_hp(n)  # ascendra: 2L1H at 3, 1L0H at 1
                    pc = (dataclasses.replace(ours_config or SlackConfig(), late=mode) if mode
                          else ours_config if p == OURS else None)
                    cfg = SimConfig(policy=p, trace=trace, instances=n, hp_instances=hp,
                                    num_requests=k, seed=seed, policy_config=pc, **SLOS[slo])
                    out.append((cell_name(trace, n, slo), label, cfg))
    return out


def feasible_alone(cfg: SimConfig) -> dict[str, Any]:
    """Requests of ``cfg``'s workload that could meet their SLOs alone on an idle GPU (the
    noiseless ground truth): whole-prompt prefill <= TTFT SLO and one decode <= TBT SLO.

    The simulated batches carry the ground truth's noise (``cfg.noise_cv``, mean-one
    lognormal), so a request just past its SLO alone may still make it by luck. Each
    request's chance of its first token in time is that of its whole prompt alone in one
    noisy batch (the shortest way there; chunks cost more noiselessly), and its chance of
    a mean TBT in time is taken as 1 where one decode alone makes it and as one draw's
    chance where it does not (a mean of many draws is no luckier): both generous, so
    their product bounds the request's chance in any schedule. ``expected_share`` is the
    mean of those chances, the most any scheduler's goodput share can be in expectation;
    ``share_p999`` adds 3.1 standard deviations of the count (normal approximation), what
    a lucky draw might reach."""
    requests = build_workload(cfg, get_model(cfg.model), build_timing(cfg)).requests
    timing = ProfileTiming(cfg.model, cfg.gpu, noise_cv=0.0, tp=cfg.tp)
    sigma = math.sqrt(math.log1p(cfg.noise_cv ** 2))

    def chance(slo: float | None, alone: float) -> float:
        """P(alone x noise <= slo); the noiseless test when there is no noise."""
        if slo is None:
            return 1.0
        if sigma == 0.0 or slo <= 0.0:
            return float(alone <= slo)
        z = (math.log(slo / alone) + sigma * sigma / 2) / sigma
        return 0.5 * math.erfc(-z / math.sqrt(2))

    ok, chances = 0, []
    for r in requests:
        prefill = timing.batch_time(BatchShape(prefills=((r.prompt_len, 0),)))
        decode = timing.batch_time(BatchShape(decodes=(r.prompt_len + 1,)))
        tbt = r.slo.tbt if r.output_len > 1 else None
        mean_tbt = 1.0 if tbt is None or decode <= tbt else chance(tbt, decode)
        chances.append(chance(r.slo.ttft, prefill) * mean_tbt)
        ok += ((r.slo.ttft is None or prefill <= r.slo.ttft)
               and (tbt is None or decode <= tbt))
    n = len(requests)
    mean, sd = sum(chances), math.sqrt(sum(c * (1 - c) for c in chances))
    return {"requests": n, "feasible_alone": ok, "share": round(ok / n, 4),
            "noise_cv": cfg.noise_cv, "expected_share": round(mean / n, 4),
            "share_p999": round(min(n, mean + 3.1 * sd) / n, 4)}


def goodput_target(slo: str, feasible_share: float) -> float:
    """0.9 on uniform cells; 0.9 x the feasible share on heterogeneous ones."""
    return round(TARGET * feasible_share, 4) if slo == "hetero" else TARGET


def run_setup(item: tuple[str, str, SimConfig], qps_max_factor: float = 64.0,
              goodput_at: float = TARGET, fixed: tuple[float, ...] = ()) -> dict[str, Any]:
    """Capacities of one setup. With ``fixed`` (per-instance rates; the heterogeneous
    cells) goodput is measured at those rates instead of searched."""
    cell, policy, cfg = item
    t0 = time.time()
    sims: dict[float, dict[str, Any]] = {}

    def run(c: SimConfig) -> dict[str, Any]:
        q = round(c.qps, 4)
        if q not in sims:
            sims[q] = simulate(c)
        return sims[q]

    start = 1.0 * cfg.instances
    top = qps_max_factor * start
    def search(criterion: str, target: float) -> dict[str, Any]:
        return find_capacity(cfg, criterion, target, run=run, qps_start=start, qps_max=top)

    res = {"tail": search("tail", TARGET), "token": search("token", TARGET)}
    if not fixed:
        res["goodput"] = search("goodput", goodput_at)
    at_rates = {}
    for rate in fixed:
        sim = run(dataclasses.replace(cfg, qps=rate * cfg.instances))
        at_rates[str(rate)] = {k: sim.get(k) for k in PROBE_KEYS}
    capacity: dict[str, float | None] = {c: r["capacity_qps"] for c, r in res.items()}
    at_limit = {c: r["at_search_limit"] for c, r in res.items()}
    if fixed:
        capacity["goodput"], at_limit["goodput"] = None, False
    return {"cell": cell, "policy": policy, "goodput_target": None if fixed else goodput_at,
            "fixed_rates": at_rates,
            "capacity": capacity, "at_limit": at_limit,
            "probes": {str(q): {k: s.get(k) for k in PROBE_KEYS} for q, s in sorted(sims.items())},
            "simulations": len(sims), "wall_s": round(time.time() - t0, 1)}


def fixed_rows(mine: dict[str, Any], seeds: list[dict[str, Any]], refs: list[dict[str, Any]]
               ) -> dict[str, dict[str, Any]]:
    """Per fixed rate: ours' goodput share, the best seed's (and which), their ratio, the
    references' shares."""
    out = {}
    for rate, s in mine["fixed_rates"].items():
        have = [r for r in seeds if rate in r.get("fixed_rates", {})]
        if not have:
            continue
        best = max(have, key=lambda r: r["fixed_rates"][rate]["goodput_share"])
        top = best["fixed_rates"][rate]["goodput_share"]
        row = {"ours": s["goodput_share"], "best_seed": top, "best_seed_policy": best["policy"],
               "ratio": round(s["goodput_share"] / top, 3) if top else None,
               "ours_dropped": s["dropped"],
               "seeds": {r["policy"]: r["fixed_rates"][rate]["goodput_share"] for r in have}}
        for r in refs:
            if rate in r.get("fixed_rates", {}):
                row[r["policy"]] = r["fixed_rates"][rate]["goodput_share"]
        out[rate] = row
    return out


def bound_for(cfg: SimConfig, target: float) -> dict[str, Any]:
    """The goodput bound on the workload ``cfg`` simulates (the bound rescales its arrivals
    to every rate it tries, so ``cfg.qps`` does not matter)."""
    requests = build_workload(cfg, get_model(cfg.model), build_timing(cfg)).requests
    floor = ProfileTiming(cfg.model, cfg.gpu, noise_cv=0.0, tp=cfg.tp)
    return goodput_bound(requests, floor, qps=cfg.qps, instances=cfg.instances, target=target)


def summarise(results: list[dict[str, Any]], bounds: dict[str, dict[str, Any]],
              refs: tuple[str, ...] | list[str] = REFS) -> list[dict[str, Any]]:
    """Per cell and criterion: ours, the best seed (and which), their ratio, the references;
    goodput vs the bound."""
    rows = []
    for cell in dict.fromkeys(r["cell"] for r in results):
        here = [r for r in results if r["cell"] == cell]
        mine = [r for r in here if r["policy"] == OURS]
        variants = [r for r in here if r["policy"].startswith(f"{OURS}-")]
        seeds = [r for r in here
                 if r["policy"] not in refs and not r["policy"].startswith(OURS)]
        if not mine or not seeds:
            continue
        row: dict[str, Any] = {"cell": cell, "bound_goodput_qps": bounds[cell]["capacity_qps"],
                               "bound": bounds[cell],
                               "goodput_target": mine[0].get("goodput_target", TARGET)}
        if mine[0].get("fixed_rates"):
            row["goodput_fixed"] = fixed_rows(mine[0], seeds, [r for r in here
                                                               if r["policy"] in refs])
        for c in CRITERIA:
            if mine[0]["capacity"][c] is None:
                row[c] = {"ours": None, "best_seed": None, "best_seed_policy": None,
                          "ratio": None, "ours_at_limit": False, "seed_at_limit": False,
                          "seeds": {}}
                continue
            best = max(seeds, key=lambda r: r["capacity"][c])
            ours, top = mine[0]["capacity"][c], best["capacity"][c]
            row[c] = {"ours": ours, "best_seed": top, "best_seed_policy": best["policy"],
                      "ratio": round(ours / top, 3) if top else None,
                      "ours_at_limit": mine[0]["at_limit"][c],
                      "seed_at_limit": best["at_limit"][c],
                      "seeds": {r["policy"]: r["capacity"][c] for r in seeds}}
            for r in here:
                if r["policy"] in refs:
                    row[c][r["policy"]] = r["capacity"][c]
                    row[c][f"{r['policy']}_at_limit"] = r["at_limit"][c]
                    v = r["capacity"][c]
                    row[c][f"ours_over_{r['policy']}"] = round(ours / v, 3) if v else None
            for r in variants:
                row[c][r["policy"]] = r["capacity"][c]
        b = bounds[cell]["capacity_qps"]
        g = row["goodput"]
        g["ours_over_bound"] = round(g["ours"] / b, 3) if b and g["ours"] is not None else None
        g["seed_over_bound"] = (round(g["best_seed"] / b, 3)
                                if b and g["best_seed"] is not None else None)
        rows.append(row)
    return rows


def ours_config(a: argparse.Namespace) -> SlackConfig | None:
    """Ours' config from slack's knob flags (``add_policy_flags``, as ``simulate --policy
    slack`` takes them); None when none is set (its defaults). A flag of another policy or
    a bad value is refused naming the flag."""
    try:
        cfg = config_from_args(OURS, a)
    except ValueError as exc:
        raise SystemExit(f"beyond_capacity: {exc}") from None
    assert isinstance(cfg, SlackConfig)
    return None if all(getattr(a, n, None) is None for n in get_spec(OURS).knobs()) else cfg


def parser() -> argparse.ArgumentParser:
    """The command line of this script (also read back from a file's ``argv``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0,
                    help="workload seed (arrivals, request sample, ground-truth noise)")
    ap.add_argument("--only", default="", help="substring filter on 'cell/policy'")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--instances", default="1,3")
    ap.add_argument("--slos", default=",".join(SLOS))
    ap.add_argument("--seeds", default="",
                    help="seed policies (default: every registered one but slack and --refs)")
    ap.add_argument("--refs", default=",".join(REFS),
                    help="reference policies reported beside ours, not seeds ('' for none)")
    ap.add_argument("--variants", default="",
                    help=f"also run slack-<mode> for these late modes ({', '.join(VARIANTS)})")
    ap.add_argument("--qps-max-factor", type=float, default=64.0,
                    help="stop doubling at this x the start rate (1 req/s per instance)")
    ap.add_argument("--hetero-rates", default="0.5,1,2",
                    help="per-instance rates at which the heterogeneous cells' goodput is "
                         "measured (no goodput capacity search there; '' to search)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the setups already in --out and run only the others")
    ap.add_argument("--out", default="docs/results/beyond_capacity.json")
    add_policy_flags(ap)  # slack's knobs for ours (docs/lab/beyond.md: --late-in-budget)
    return ap


def grid_args(grid: dict[str, Any]) -> argparse.Namespace:
    """The options a result file was written with (its last run's ``argv``)."""
    return parser().parse_args(grid["argv"])


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    refs = [r for r in a.refs.split(",") if r]
    seeds = (a.seeds.split(",") if a.seeds
             else [p for p in policy_names() if p != OURS and p not in refs])
    argv_used = sys.argv[1:] if argv is None else argv
    for name in a.slos.split(","):
        if name not in SLOS:
            raise SystemExit(f"--slos: unknown {name!r}; choose from {', '.join(SLOS)}")
    items = [s for s in setups(a.num_requests, a.traces.split(","),
                               [int(x) for x in a.instances.split(",")], a.slos.split(","),
                               seeds, refs, [v for v in a.variants.split(",") if v],
                               ours_config(a), a.seed)
             if a.only in f"{s[0]}/{s[1]}"]
    t0 = time.time()
    cells = {i[0]: i for i in items}  # every cell asked for: its bound and feasible share
    results: list[dict[str, Any]] = []   # are recomputed (cheap), even on --resume
    if a.resume:
        try:
            with open(a.out) as f:
                results = json.load(f)["results"]
        except FileNotFoundError:
            pass
        have = {(r["cell"], r["policy"]) for r in results}
        items = [i for i in items if (i[0], i[1]) not in have]
    feasible: dict[str, dict[str, Any]] = {}
    bounds: dict[str, dict[str, Any]] = {}
    for cell, (_, _, cfg) in cells.items():
        slo = cell.rsplit("/", 1)[1]
        feasible[cell] = feasible_alone(cfg)
        bounds[cell] = bound_for(cfg, goodput_target(slo, feasible[cell]["share"]))
    if a.resume:
        try:
            with open(a.out) as f:
                old = json.load(f)
            bounds = {**old.get("bounds", {}), **bounds}
            feasible = {**old.get("feasible", {}), **feasible}
        except FileNotFoundError:
            pass

    def dump(rows: list[dict[str, Any]]) -> None:
        with open(a.out, "w") as f:
            json.dump({"argv": argv_used, "num_requests": a.num_requests, "seeds": seeds,
                       "refs": refs, "wall_s": round(time.time() - t0, 1), "cells": rows,
                       "bounds": bounds, "feasible": feasible, "results": results}, f, indent=1)

    def done(r: dict[str, Any]) -> None:
        results.append(r)
        c, lim = r["capacity"], r["at_limit"]
        text = " ".join("-" if c[k] is None else f"{'>=' if lim[k] else ''}{c[k]:.3f}"
                        for k in CRITERIA)
        text += "".join(f" @{q}:{v['goodput_share']:.3f}" for q, v in r["fixed_rates"].items())
        print(f"{r['cell']:28} {r['policy']:13} {text}  sims={r['simulations']} "
              f"wall={r['wall_s']}", flush=True)
        dump(summarise(results, bounds, refs))

    def target(cell: str) -> float:
        return goodput_target(cell.rsplit("/", 1)[1], feasible[cell]["share"])

    rates = tuple(float(x) for x in a.hetero_rates.split(",") if x)

    def fixed(cell: str) -> tuple[float, ...]:
        return rates if cell.endswith("/hetero") else ()

    if a.jobs <= 1:  # in-process (also when loaded by path, where workers cannot import it)
        for i in items:
            done(run_setup(i, a.qps_max_factor, target(i[0]), fixed(i[0])))
    else:
        with ProcessPoolExecutor(a.jobs) as pool:
            futures = [pool.submit(run_setup, i, a.qps_max_factor, target(i[0]), fixed(i[0]))
                       for i in items]
            for fut in as_completed(futures):
                done(fut.result())
    rows = summarise(results, bounds, refs)
    for row in rows:
        g, t = row["goodput"], row["tail"]
        print(f"{row['cell']:28} goodput {g['ours']} vs {g['best_seed']} "
              f"({g['best_seed_policy']}) x{g['ratio']}  tail {t['ours']} vs "
              f"{t['best_seed']} ({t['best_seed_policy']})  "
              f"bound {row['bound_goodput_qps']:.3f} ours/bound {g['ours_over_bound']}"
              + "".join(f"  @{q}: {v['ours']:.3f} vs {v['best_seed']:.3f} x{v['ratio']}"
                        for q, v in row.get("goodput_fixed", {}).items()), flush=True)
    dump(rows)


if __name__ == "__main__":
    main()
