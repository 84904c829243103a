"""``sloserve bench --compare-sim``: the live run next to ``simulate`` for the same seed.

Issue 14, build item 4: after a bench run against a stack, the same workload
(trace, seed, arrivals, SLOs, request count, rate) is simulated in this process
with the deployment the stack reports about itself: the gateway's ``Info``
(model, hardware, instances and roles, KV blocks) and each scheduler's
``Status`` (policy and ``policy_config``, every knob resolved; ``deployment``, the
resolved ``Deployment`` it runs, whose prefix caching is simulated). The live stack's
scheduler's admission limits (its ``Status.admission``: ``up``'s flags) are simulated too
(``simulate --admission``).
Optionally the simulator's ground truth includes a measured overhead profile
(``--overhead-profile``, ``sloserve.sim.overhead``). The stack's schedulers say
whether they run overlap scheduling (``Status.overlap``, the default); the
simulation then does too (``simulate --overlap``, ``sloserve.driver``). They
also say how often the perf-model service refits the coefficients they predict with
(``Status.coefficients_refit_interval_s``, from the published fit); the simulation
refits its online model on that clock (``simulate --refit-interval``).

``--overhead-out FILE`` saves the un-hidden gaps the stack's schedulers measured
during the run (``Status.unhidden_samples_s``, pooled over instances) as such a
profile. The scheduler's internal plane may require ``$SLOSERVE_INTERNAL_TOKEN``
(``sloserve up`` generates one unless it is set): set it for both commands.

With the live arrivals known (the gateway's stamp on each request's first chunk), the
workload is simulated once more with every request arriving then (``replayed_arrivals``:
``SimConfig.arrival_times``), which takes the client's lateness in sending out of the
difference.

The simulation draws the ground truth's noise as the stack's sim executors did
(``live_noise``: executor ``k`` of a stack seeded ``S`` draws ``stream_seed(S, k)``,
``simulate --noise-streams instance --noise-seed S``), so both runs see the same
batch-time noise for the same batches on the same instance.

Reported per metric: live, sim, and the relative difference (live - sim) / sim.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import grpc

from sloserve.deployment import Deployment
from sloserve.policies import get_spec
from sloserve.sim.config import SimConfig
from sloserve.sim.overhead import OverheadProfile

# (key, label): summarize's keys, plus request throughput (completed / duration)
COMPARED = (
    ("ttft_p50", "TTFT P50"), ("ttft_p99", "TTFT P99"),
    ("tbt_p50", "TBT P50"), ("tbt_p99", "TBT P99"),
    ("mean_tbt_p50", "mean TBT P50"), ("goodput_share", "goodput share"),
    ("throughput_tok_s", "throughput tok/s"), ("request_throughput", "throughput req/s"),
)


@dataclass(slots=True)
class LiveTimings:
    """What the client sees beside the token times: how late each request reached the
    gateway (its stamp minus the workload's arrival offset) and each token's delivery
    lag (gateway emit time minus the iteration's end on the instance)."""

    wall_t0: float = 0.0
    arrival_lag_s: list[float] = field(default_factory=list)
    delivery_lag_s: list[float] = field(default_factory=list)
    produced: dict[str, list[float]] = field(default_factory=dict)  # per request, iteration ends
    # per request, its arrival offset: the gateway's stamp minus wall_t0 once its first chunk
    # came, else the workload's offset (refused or failed before a token)
    arrivals: dict[str, float] = field(default_factory=dict)
    # summarize() over the iteration ends instead of the gateway's emit times (set by replay)
    instance_side: dict[str, Any] | None = None
    arrival_offsets: tuple[float, ...] | None = None  # ``arrivals`` in workload order

    def after_run(self, reqs: list[Any]) -> None:
        """After the run: its metrics on the instances' clock (each token at the end of the
        iteration that produced it (what the simulator models), arrivals as stamped), and
        the arrivals as the gateway stamped them, in workload order (``replay_arrivals``)."""
        import dataclasses

        from sloserve.metrics import summarize

        if all(r.request_id in self.arrivals for r in reqs):
            self.arrival_offsets = tuple(max(0.0, self.arrivals[r.request_id]) for r in reqs)

        copies = [dataclasses.replace(r, token_times=list(self.produced.get(r.request_id, [])))
                  if len(self.produced.get(r.request_id, [])) == len(r.token_times) else r
                  for r in reqs]
        self.instance_side = dict(summarize(copies))

    def summary(self) -> dict[str, float | None]:
        import numpy as np

        out: dict[str, float | None] = {}
        for name, xs in (("arrival_lag", self.arrival_lag_s),
                         ("delivery_lag", self.delivery_lag_s)):
            p = np.percentile(xs, (50, 99)) if xs else (None, None)
            out[f"{name}_p50_ms"] = None if p[0] is None else float(p[0]) * 1e3
            out[f"{name}_p99_ms"] = None if p[1] is None else float(p[1]) * 1e3
        return out


async def statuses(info: dict[str, Any], samples: bool = False) -> list[Any]:
    """Every scheduler's ``Status`` (the addresses from the gateway's ``Info``)."""
    from sloserve.services import rpc
    from sloserve.services.proto import scheduler_grpc, scheduler_pb2

    out = []
    for inst in info["instances"]:
        async with rpc.channel(inst["address"]) as ch:
            try:
                st = await scheduler_grpc.SchedulerStub(ch).Status(
                    scheduler_pb2.StatusRequest(samples=samples), timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                hint = (" (set $SLOSERVE_INTERNAL_TOKEN to the stack's internal token)"
                        if exc.code() == grpc.StatusCode.UNAUTHENTICATED else "")
                raise ValueError(f"compare_sim (--compare-sim): scheduler {inst['address']} "
                                 f"Status failed: {exc.code().name}{hint}") from None
        out.append(st)
    return out


def live_noise(inst: list[dict[str, Any]]) -> tuple[int, float] | None:
    """``(seed, cv)`` of the stack's ground-truth noise where ``simulate`` can replay it:
    every instance a sim executor drawing ``stream_seed(seed, k)``, ``k`` its index in
    its id (``lp0``, ``lp1``, ``hp2``, as the simulator names them), one seed and CV for
    all. None otherwise (another backend, a fixed batch time, hand-set seeds)."""
    from sloserve.perf.noise import parse_stream_seed

    seeds, cvs = set(), set()
    for i in inst:
        iid = re.fullmatch(r"[a-z]+(\d+)", i.get("instance_id", ""))
        stream = parse_stream_seed(i.get("noise_stream", ""))
        if iid is None or stream is None or stream[1] != int(iid.group(1)):
            return None
        seeds.add(stream[0])
        cvs.add(float(i.get("noise_cv", 0.0)))
    if len(seeds) != 1 or len(cvs) != 1:
        return None
    return seeds.pop(), cvs.pop()


def live_refit_interval(sts: list[Any]) -> float | None:
    """The perf-model service's refit period as every scheduler's coefficients say it
    (``simulate --refit-interval``); None where they do not agree or do not say (the
    simulator's default cadence then)."""
    said = {st.coefficients_refit_interval_s for st in sts}
    if len(said) != 1:
        return None
    interval = float(said.pop())
    return interval if interval > 0 else None


def sim_config(args: Any, info: dict[str, Any], sts: list[Any],
               overhead_profile: str | None) -> SimConfig:
    """The ``SimConfig`` that replays ``args``' workload on the stack ``info`` describes."""
    from sloserve.defaults import workload_slos
    from sloserve.services.admission_flags import from_json

    policies = sorted({st.policy for st in sts})
    if len(policies) != 1:
        raise ValueError(f"compare_sim (--compare-sim): the stack runs several policies "
                         f"{policies}; simulate runs one")
    policy = policies[0]
    spec = get_spec(policy)
    # every instance runs the config `up` resolved once; an HP's role rules are applied
    # by the policy, not written into it, so the first LP's is the deployment's
    lp = [st for st in sts if st.role != "hp"]
    said = (lp or sts)[0].deployment
    dep = Deployment.from_json(said) if said else None
    raw = json.loads((lp or sts)[0].policy_config)
    knobs = spec.knobs()
    config = spec.config_cls(**{k: v for k, v in raw.items() if k in knobs})
    inst = info["instances"]
    ttft, tbt = workload_slos(args.ttft_slo, args.tbt_slo, args.slo_mix)
    cfg = SimConfig(
        policy=policy, model=info["model"], gpu=inst[0]["hardware"], instances=len(inst),
        hp_instances=sum(1 for i in inst if i.get("role") == "hp"),
        trace=args.trace, trace_file=args.trace_file, qps=args.qps,
        num_requests=args.num_requests, ttft_slo=ttft, tbt_slo=tbt, slo_mix=args.slo_mix,
        jct_share=args.jct_share, arrival=args.arrival, cv=args.cv, seed=args.seed,
        sample=getattr(args, "sample", None),
        num_blocks=int(inst[0]["kv_capacity_blocks"]), block_size=int(inst[0]["block_size"]),
        policy_config=config, admission=from_json((lp or sts)[0].admission),
        overhead_profile=overhead_profile,
        overlap=all(st.overlap for st in sts),  # the scheduler's loop (sloserve.driver)
        # the Deployment the schedulers run (Status.deployment); a scheduler that does not
        # say is one from before it, which ran without prefix caching
        prefix_caching=dep.prefix_caching if dep is not None else False,
        # the gateway's router (``up --prefix-routing``, issue 33, item 4): the same
        # PrefixRouter in the simulator's controller, else it simulates round-robin
        prefix_routing=dep.prefix_routing if dep is not None else False,
        # the live scheduler names a request's blocks by its prompt's token ids: the blocks
        # its answer fills are never found again (docs/serve.md, "Prefix caching")
        prefix_cache_outputs=False,
        refit_interval=live_refit_interval(sts),
    )
    # the executors' own noise draws where they can be replayed, else one stream seeded by
    # the workload's seed (the simulator's default)
    noise = live_noise(inst)
    if noise is None:
        return cfg
    return dataclasses.replace(cfg, noise_seed=noise[0], noise_cv=noise[1],
                               noise_streams="instance")


def _request_throughput(out: dict[str, Any]) -> float | None:
    dur = out.get("duration")
    return out["completed"] / dur if dur else None


def differences(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per compared metric: live, sim, and (live - sim) / sim (None where undefined)."""
    out: dict[str, dict[str, Any]] = {}
    for key, _ in COMPARED:
        a = _request_throughput(live) if key == "request_throughput" else live.get(key)
        b = _request_throughput(sim) if key == "request_throughput" else sim.get(key)
        rel = (a - b) / b if isinstance(a, float | int) and isinstance(b, float | int) and b \
            else None
        out[key] = {"live": a, "sim": b, "diff": rel}
    return out


def compare(live: dict[str, Any], args: Any, info: dict[str, Any], sts: list[Any],
            probe: LiveTimings | None = None) -> dict[str, Any]:
    """Simulate ``args``' workload on the stack and compare it with the ``live`` result."""
    from sloserve.sim.simulator import simulate

    cfg = sim_config(args, info, sts, getattr(args, "overhead_profile", None))
    sim = simulate(cfg)
    out: dict[str, Any] = {
        "sim_config": {"policy": cfg.policy, "instances": cfg.instances,
                       "hp_instances": cfg.hp_instances, "model": cfg.model, "gpu": cfg.gpu,
                       "num_blocks": cfg.num_blocks, "qps": cfg.qps, "seed": cfg.seed,
                       "overhead_profile": cfg.overhead_profile, "overlap": cfg.overlap,
                       "noise_seed": cfg.truth_seed, "noise_streams": cfg.noise_streams,
                       "noise_cv": cfg.noise_cv, "refit_interval": cfg.refit_interval,
                       "prefix_caching": cfg.prefix_caching,
                       "prefix_routing": cfg.prefix_routing,
                       "prefix_cache_outputs": cfg.prefix_cache_outputs,
                       # the executors' own noise draws, not the workload seed's stream
                       "noise_replayed": cfg.noise_seed is not None,
                       "policy_config": json.loads(sts[0].policy_config)},
        "metrics": differences(live, sim),
        "live_unhidden_p50_ms": [st.unhidden_p50_s * 1e3 for st in sts],
        "live_unhidden_p99_ms": [st.unhidden_p99_s * 1e3 for st in sts],
        "live_overhead_p50_ms": [st.overhead_p50_s * 1e3 for st in sts],
        "live_iterations": sum(st.iterations for st in sts),
        "sim_iterations": sim["iterations"],
        # Ascendra's LP -> HP offloads: a threshold decision (docs/lab/live-stack.md)
        "live_offloads": live.get("offloads"), "sim_offloads": sim.get("offloads"),
        # prompt tokens found cached / looked up (live: the gateway's /metrics, per engine)
        "sim_prefix_hit_rate": sim.get("prefix_hit_rate"),
        "overlap": [st.overlap for st in sts],
        "load_avg_1m": os.getloadavg()[0],
    }
    if probe is not None:
        out.update(probe.summary())
        if probe.instance_side is not None:
            out["instance_side_metrics"] = differences(probe.instance_side, sim)
        if probe.arrival_offsets is not None:
            out["replayed_arrivals"] = replay_arrivals(cfg, live, probe)
    return out


def replay_arrivals(cfg: SimConfig, live: dict[str, Any], probe: LiveTimings) -> dict[str, Any]:
    """The same simulation with each request arriving when the live gateway stamped it
    (``SimConfig.arrival_times``) instead of at its workload offset: what remains is the
    stack's own difference, not the client's lateness in sending."""
    from sloserve.sim.simulator import simulate

    assert probe.arrival_offsets is not None
    sim = simulate(dataclasses.replace(cfg, arrival_times=probe.arrival_offsets))
    out: dict[str, Any] = {"metrics": differences(live, sim),
                           "stamped": len(probe.arrival_lag_s)}
    if probe.instance_side is not None:
        out["instance_side_metrics"] = differences(probe.instance_side, sim)
    return out


def format_comparison(cmp: dict[str, Any]) -> str:
    replay = cmp.get("replayed_arrivals", {}).get("metrics")
    lines = [f"live vs simulate (same seed {cmp['sim_config']['seed']}, "
             f"{cmp['sim_config']['qps']:g} req/s; overhead profile: "
             f"{cmp['sim_config']['overhead_profile'] or 'none'})"
             + ("; sim*: arrivals as the gateway stamped them" if replay else ""),
             f"{'metric':<20}{'live':>14}{'sim':>14}{'diff':>10}"
             + (f"{'sim*':>14}{'diff*':>10}" if replay else "")]
    for key, label in COMPARED:
        row = [cmp["metrics"][key]] + ([replay[key]] if replay else [])
        cells = [f"{v:>14.4g}" if isinstance(v, float | int) else f"{'-':>14}"
                 for v in (row[0]["live"], row[0]["sim"])]
        for k, m in enumerate(row):
            if k:
                sim = m["sim"]
                cells.append(f"{sim:>14.4g}" if isinstance(sim, float | int) else f"{'-':>14}")
            cells.append(f"{m['diff'] * 100:>+9.1f}%" if m["diff"] is not None else f"{'-':>10}")
        lines.append(f"{label:<20}{''.join(cells)}")
    return "\n".join(lines)


def overhead_profile(sts: list[Any], backend: str, source: dict[str, Any],
                     delivery: list[float] | None = None) -> OverheadProfile:
    """The run's un-hidden gaps, pooled over the stack's schedulers, as a profile; with
    the tokens' delivery lags the client saw (``LiveTimings.delivery_lag_s``, a uniform
    subsample of at most ``DELIVERY_SAMPLES``, seeded; a negative one, clocks apart,
    counts as 0)."""
    import random

    from sloserve.sim.overhead import DELIVERY_SAMPLES

    lags = list(delivery or ())
    if len(lags) > DELIVERY_SAMPLES:
        lags = random.Random(0).sample(lags, DELIVERY_SAMPLES)
    samples = [x for st in sts for x in st.unhidden_samples_s]
    if not samples:
        raise ValueError("overhead_out (--overhead-out): the schedulers measured no gap "
                         "between back-to-back batches (no busy period in the run)")
    return OverheadProfile(tuple(samples), backend=backend, policy=sts[0].policy,
                           overlap=all(st.overlap for st in sts), source=source,
                           delivery_s=tuple(max(0.0, x) for x in lags))
