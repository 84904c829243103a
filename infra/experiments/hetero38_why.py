"""Issue 38, item 5: why ``slack`` falls below vLLM on AccelGen's per-request SLOs, and how
far any schedule could go (docs/lab/beyond.md, "The heterogeneous line: why").

Usage: python infra/experiments/hetero38_why.py --out docs/results/issue38_hetero_why.json

Every run is ``infra/sweeps/hetero38.yaml``'s (400 requests, ``--slo-mix hetero``, TBT
anchor 0.1875 s); the simulator is deterministic per seed. Four parts:

* ``lost``: at the seven (cell, rate) points where ``slack`` was below the best seed (vLLM),
  seed 0, each request that could meet its SLOs alone on the noiseless ground truth, for
  ``slack`` and ``vllm``: on time, *late start* (its first iteration began after its TTFT
  deadline less its prefill alone: no schedule of its own work could save it from there),
  *slow service* (it started in time and still missed: chunks, decodes or other prompts
  beside it), TBT miss or dropped. For the requests vLLM serves on time and ``slack`` does
  not, why ``slack``'s stall rule (``slack_stall.StallRule.widen``) did not run the prompt
  whole the first time it was the head of the queue: its chunks were predicted to make
  it, it fitted the budget or was predicted late even whole, a decode's mean TBT, or the
  stall budget (``stall_share``); the rule is only watched, never changed.
* ``seeds``: ``slack`` and ``vllm`` at the same seven points, seeds 1 and 2.
* ``budget``: ``slack`` at the seven points, seed 0, with ``stall_share`` at the most the
  knob allows (0.01, the P99 criterion's whole 1 %) and with no stall budget at all
  (``tail_tbt`` 100 s: no gap is ever past it), to show what the budget costs.
* ``bound``: at all 24 points, seed 0, an upper bound on the share any schedule can reach
  from prefill contention alone: of n + 1 requests (n instances) pairwise unable to both
  prefill in time on one GPU — the least time to prefill two (one batch, or one after the
  other) longer than from the earlier arrival to the later deadline — at most n are on
  time, so each disjoint such group found (greedily) costs one; decodes and the noise's
  luck are left out. Beside it the share of feasible requests whose TTFT slack (SLO less
  prefill alone) is under one decode-only iteration, and vLLM's GPU-busy share.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sloserve.batch import BatchShape
from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.models import get_model
from sloserve.policies import slack_stall
from sloserve.policies.base import InstanceView
from sloserve.policies.slack_config import SlackConfig
from sloserve.policies.slack_rules import doomed, prompt_work
from sloserve.request import Request
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation, build_timing, build_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
import beyond_capacity as bc  # noqa: E402

POINTS = [("sharegpt", 1, 0.5), ("sharegpt", 3, 1.5), ("sharegpt", 3, 3.0),
          ("sharegpt", 3, 6.0), ("arxiv", 3, 3.0), ("arxiv", 3, 6.0), ("azure-code", 3, 1.5)]
CELLS = [(t, n) for n in (1, 3) for t in ("sharegpt", "arxiv", "azure-conv", "azure-code")]
RATES = {1: (0.5, 1.0, 2.0), 3: (1.5, 3.0, 6.0)}  # the spec's req/s, all instances together


def config(policy: str, trace: str, n: int, qps: float, seed: int = 0,
           pc: SlackConfig | None = None, record: bool = False) -> SimConfig:
    """The spec's run (``infra/sweeps/hetero38.yaml``)."""
    return SimConfig(policy=policy, trace=trace, instances=n, num_requests=400, seed=seed,
                     slo_mix="hetero", ttft_slo=None, tbt_slo=0.1875, qps=qps,
                     policy_config=pc, record_decisions=record)


def on_time(r: Request) -> bool:
    """Goodput's test (docs/design.md): finished, TTFT and mean TBT within the SLOs."""
    if r.finish_time is None or r.drop_reason or r.ttft is None:
        return False
    if r.slo.ttft is not None and r.ttft > r.slo.ttft:
        return False
    mean = r.mean_tbt
    return r.slo.tbt is None or mean is None or mean <= r.slo.tbt


def truth(cfg: SimConfig) -> ProfileTiming:
    return ProfileTiming(cfg.model, cfg.gpu, noise_cv=0.0, tp=cfg.tp)


def alone(timing: ProfileTiming, r: Request) -> float:
    return timing.batch_time(BatchShape(prefills=((r.prompt_len, 0),)))


def feasible(timing: ProfileTiming, r: Request) -> bool:
    """Both SLOs met alone on the noiseless ground truth (``feasible_alone``'s test)."""
    tbt = r.slo.tbt if r.output_len > 1 else None
    return ((r.slo.ttft is None or alone(timing, r) <= r.slo.ttft)
            and (tbt is None or timing.batch_time(BatchShape(decodes=(r.prompt_len + 1,))) <= tbt))


def outcome(timing: ProfileTiming, r: Request) -> str:
    if on_time(r):
        return "on time"
    if r.drop_reason:
        return "dropped"
    if r.first_scheduled_time is None or r.ttft is None or r.slo.ttft is None:
        return "never served"
    if r.ttft <= r.slo.ttft:
        return "TBT miss"
    if r.first_scheduled_time - r.arrival_time + alone(timing, r) > r.slo.ttft:
        return "late start"
    return "slow service"


StallCall = Callable[..., tuple[float, int, bool]]


def stall_reasons() -> tuple[dict[str, str], StallCall]:
    """Watch ``StallRule.widen``: for each head prompt, the first time the rule looks at it,
    what it did and which of its tests said no (the same tests, re-evaluated)."""
    seen: dict[str, str] = {}
    original: StallCall = slack_stall.StallRule.widen

    def widen(self: slack_stall.StallRule, view: InstanceView, cfg: SlackConfig,
              decodes: list[Request], budgeted: list[Request], head: Request,
              start_by: float, limit: float, allowance: int) -> tuple[float, int, bool]:
        out = original(self, view, cfg, decodes, budgeted, head, start_by, limit, allowance)
        if head.request_id not in seen:
            seen[head.request_id] = ("stalled" if out[1] != allowance or out[2] else why_not(
                view, cfg, decodes, budgeted, head, start_by, limit, allowance))
        return out
    return seen, widen


def why_not(view: InstanceView, cfg: SlackConfig, decodes: list[Request],
            budgeted: list[Request], head: Request, start_by: float, limit: float,
            allowance: int) -> str:
    """The test of ``StallRule.widen`` that kept ``head`` from running whole (the stall
    budget, when every other test passed)."""
    work, deadline = prompt_work(head), head.ttft_deadline
    if deadline is None or head.num_generated or work > cfg.max_num_batched_tokens:
        return "not a fresh prompt"
    dec = tuple(r.num_computed for r in decodes)
    fits = work <= allowance
    if not fits and not doomed(head, start_by, view, limit, allowance, dec):
        return "its chunks were predicted to make it"
    predict, now = view.perf_model.predict, view.now
    prompt = ((work, head.num_computed),)
    took = gap = predict(BatchShape(prefills=prompt, decodes=dec))
    solo_ok = False
    if dec and head.slo.ttft is not None and now + took * (1 + slack_stall.ALONE_MARGIN) > deadline:
        solo = predict(BatchShape(prefills=prompt))
        solo_ok = head.slo.ttft < cfg.alone_tight * solo and now + solo <= deadline
        if solo_ok:
            took, gap = solo, solo + predict(BatchShape(decodes=dec))
    if not solo_ok and (fits or now + took > deadline):
        return "fitted the budget, or predicted late even whole"
    for r in budgeted:
        tbt, tt = r.slo.tbt, r.token_times
        if tbt is not None and tt and gap > cfg.tbt_margin * (tt[0] + len(tt) * tbt - now):
            return "a decode's mean TBT"
    return "the stall budget (stall_share)"


def lost_part() -> list[dict[str, Any]]:
    rows = []
    for trace, n, qps in POINTS:
        cfg = config("slack", trace, n, qps)
        timing = truth(cfg)
        seen, widen = stall_reasons()
        original = slack_stall.StallRule.widen
        slack_stall.StallRule.widen = widen  # type: ignore[method-assign]
        try:
            ours = Simulation(cfg)
            s_ours = ours.run()
        finally:
            slack_stall.StallRule.widen = original  # type: ignore[method-assign]
        vllm = Simulation(config("vllm", trace, n, qps))
        s_vllm = vllm.run()
        theirs = {r.request_id: r for r in vllm.workload.requests}
        count: dict[str, Counter[str]] = {"slack": Counter(), "vllm": Counter()}
        lost: Counter[str] = Counter()
        lost_prompts: list[int] = []
        won = 0
        for r in ours.workload.requests:
            if not feasible(timing, r):
                continue
            v = theirs[r.request_id]
            count["slack"][outcome(timing, r)] += 1
            count["vllm"][outcome(timing, v)] += 1
            if on_time(v) and not on_time(r):
                lost[f"{outcome(timing, r)}: {seen.get(r.request_id, 'never the head')}"] += 1
                lost_prompts.append(r.prompt_len)
            won += on_time(r) and not on_time(v)
        rows.append({"cell": f"{trace}-x{n}", "qps": qps, "slack": s_ours["goodput_share"],
                     "vllm": s_vllm["goodput_share"],
                     "feasible_outcomes": {k: dict(c) for k, c in count.items()},
                     "vllm_only_on_time": sum(lost.values()), "slack_only_on_time": won,
                     "vllm_only_why": dict(lost.most_common()),
                     "vllm_only_prompt_lens": sorted(lost_prompts)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def seeds_part() -> list[dict[str, Any]]:
    rows = []
    for seed in (1, 2):
        for trace, n, qps in POINTS:
            share = {p: Simulation(config(p, trace, n, qps, seed)).run()["goodput_share"]
                     for p in ("slack", "vllm")}
            rows.append({"seed": seed, "cell": f"{trace}-x{n}", "qps": qps, **share})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def budget_part() -> list[dict[str, Any]]:
    variants = {"default": SlackConfig(), "stall_share 0.01": SlackConfig(stall_share=0.01),
                "no stall budget (tail_tbt 100)": SlackConfig(tail_tbt=100.0)}
    rows = []
    for trace, n, qps in POINTS:
        row: dict[str, Any] = {"cell": f"{trace}-x{n}", "qps": qps}
        for name, pc in variants.items():
            s = Simulation(config("slack", trace, n, qps, pc=pc)).run()
            row[name] = {"goodput_share": s["goodput_share"], "tbt_token_p99": s["tbt_token_p99"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def groups_in_conflict(reqs: Sequence[Request], n: int, timing: ProfileTiming) -> int:
    """Disjoint groups of ``n`` + 1 requests, pairwise unable to both prefill in time on one
    GPU, found greedily in arrival order (each costs at least one on-time request)."""
    def least(group: Sequence[Request]) -> float:
        together = timing.batch_time(BatchShape(prefills=tuple((r.prompt_len, 0) for r in group)))
        return min(together, sum(alone(timing, r) for r in group))

    def conflict(a: Request, b: Request) -> bool:
        assert a.slo.ttft is not None and b.slo.ttft is not None
        lo = min(a.arrival_time, b.arrival_time)
        hi = max(a.arrival_time + a.slo.ttft, b.arrival_time + b.slo.ttft)
        return least((a, b)) > hi - lo

    used: set[str] = set()
    found = 0
    for i, a in enumerate(reqs):
        if a.request_id in used or a.slo.ttft is None:
            continue
        end = a.arrival_time + a.slo.ttft
        cand = [b for b in reqs[i + 1:i + 40] if b.request_id not in used
                and b.arrival_time < end and conflict(a, b)]
        for combo in itertools.combinations(cand[:8], n):
            if all(conflict(x, y) for x, y in itertools.combinations(combo, 2)):
                used.add(a.request_id)
                used.update(x.request_id for x in combo)
                found += 1
                break
    return found


def bound_part() -> list[dict[str, Any]]:
    rows = []
    for trace, n in CELLS:
        for qps in RATES[n]:
            cfg = config("vllm", trace, n, qps, record=True)
            timing = truth(cfg)
            reqs = build_workload(cfg, get_model(cfg.model), build_timing(cfg)).requests
            ok = sorted((r for r in reqs if feasible(timing, r)), key=lambda r: r.arrival_time)
            groups = groups_in_conflict(ok, n, timing)
            e = bc.feasible_alone(cfg)["expected_share"]
            decode = timing.batch_time(BatchShape(decodes=(1,)))
            thin = sum(1 for r in ok if r.slo.ttft is not None
                       and r.slo.ttft - alone(timing, r) < decode)
            sim = Simulation(cfg)
            s = sim.run()
            assert sim.plans is not None
            busy = sum(end - start for _, start, end, _ in sim.plans) / (n * s["duration"])
            bound = (len(ok) - groups) / len(reqs)
            rows.append({"cell": f"{trace}-x{n}", "qps_per_instance": qps / n, "E": e,
                         "feasible_alone": round(len(ok) / len(reqs), 4),
                         "groups_in_conflict": groups, "bound": round(bound, 4),
                         "bound_over_E": round(bound / e, 3),
                         "feasible_slack_under_one_decode": round(thin / max(1, len(ok)), 3),
                         "decode_iteration_s": round(decode, 4),
                         "vllm_gpu_busy": round(busy, 3), "vllm": s["goodput_share"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


PARTS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "lost": lost_part, "seeds": seeds_part, "budget": budget_part, "bound": bound_part}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    a = p.parse_args(argv)
    parts = a.parts.split(",")
    for name in parts:
        if name not in PARTS:
            p.error(f"--parts: unknown part {name!r} (one of {', '.join(PARTS)})")
    out: dict[str, Any] = {"issue": 38, "item": 5, "spec": "infra/sweeps/hetero38.yaml",
                           "slack_config": dataclasses.asdict(SlackConfig())}
    for name in parts:
        out[name] = PARTS[name]()
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
