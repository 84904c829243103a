"""``python -m sloserve.services.scheduler``: build the instance and serve it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
from dataclasses import replace

from sloserve.admission import Admission, for_deployment
from sloserve.deployment import Deployment
from sloserve.health import HANG_FACTOR, HANG_SLACK_S, HangDeadline
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.kv_prefix import PrefixCachingBlockManager
from sloserve.policies import Policy, get_spec
from sloserve.policies.flags import add_policy_flags, config_from_args
from sloserve.services import admission_flags, deployment_flags, obs, rpc
from sloserve.services.argtypes import number
from sloserve.services.deployment_flags import (
    add_deployment_arg,
    base_deployment,
    deployment_from_args,
)
from sloserve.services.perfmodel.coefficients import Published, follow, regression_for
from sloserve.services.proto import SERVICE_NAMES, executor_grpc, executor_pb2, scheduler_grpc
from sloserve.services.redisconn import Outage, connect
from sloserve.services.registry import announce
from sloserve.services.scheduler import loop
from sloserve.services.scheduler.clock import make_clock
from sloserve.services.scheduler.server import SchedulerService
from sloserve.services.scheduler.state import RequestStore
from sloserve.services.store import Keys

PREFIX_CACHING_BACKENDS = ("torch", "vllm", "sim")  # executors that accept a start past 0


async def _describe(
    stub: executor_grpc.ExecutorStub, timeout: float
) -> executor_pb2.ExecutorDescription:
    async def describe() -> executor_pb2.ExecutorDescription:
        desc: executor_pb2.ExecutorDescription = await stub.Describe(
            executor_pb2.DescribeRequest(), timeout=2.0)
        return desc

    return await rpc.retry_until_up(describe, timeout)


async def serve(args: argparse.Namespace) -> None:
    dep = deployment_of(args)  # a bad knob or field fails before any connection
    policy = policy_of(dep, args.role)
    admission = None if dep.admission is None else for_deployment(dep.admission,
                                                                  dep.hp_instances)
    hang = hang_from_args(args)
    redis = connect(args.redis_url)
    keys = Keys(args.prefix)
    executor = executor_grpc.ExecutorStub(rpc.channel(args.executor))
    # start-up progress: ``up`` reads these events from the log (issue 35)
    obs.setup_logging("scheduler").info("waiting_for_executor", executor=args.executor)
    desc = await _describe(executor, args.connect_timeout)
    perf_model = regression_for(desc.model, desc.hardware)  # roofline until the first fit
    if dep.prefix_caching and desc.backend not in PREFIX_CACHING_BACKENDS:
        raise ValueError(f"--prefix-caching: the {desc.backend} executor cannot start a "
                         f"request over cached blocks (only {', '.join(PREFIX_CACHING_BACKENDS)})")
    kv_cls = PrefixCachingBlockManager if dep.prefix_caching else BlockManager
    clock = make_clock(args.clock)
    instance = Instance(
        args.instance_id, policy, kv_cls(desc.kv_capacity_blocks, desc.block_size),
        perf_model, role=args.role, timers=not clock.virtual,  # an event clock has no timers
    )
    store = RequestStore(redis, keys, args.instance_id)
    log = open(args.decision_log, "a") if args.decision_log else None
    # the Deployment's None: on (SGLang's choice), unless $SLOSERVE_OVERLAP=0
    overlap = os.environ.get("SLOSERVE_OVERLAP", "1") != "0" if dep.overlap is None \
        else dep.overlap
    svc = SchedulerService(instance, store, dep.policy, desc, clock, log,
                           admission, hang, overlap=overlap, deployment=dep,
                           stream_interval=args.stream_interval)
    store.live, store.outage.log = svc.live_requests, svc.log

    def apply(c: Published) -> None:
        perf_model.set_coefficients(c.values)
        svc.coefficients = c

    tasks = []
    if dep.perf_model == "online":  # roofline: the uncalibrated model, frozen (tests)
        svc.log.info("waiting_for_perf_model", wait_s=args.coefficients_wait)
        tasks.append(await follow(redis, keys.coefficients, apply, wait_s=args.coefficients_wait,
                                  outage=Outage("coefficients", svc.log)))
    svc.restore(await store.outage.until_ok(store.restore))  # waits for Redis: never guess
    server, svc.health = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["scheduler"],
        lambda s: scheduler_grpc.add_SchedulerServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    # the registry (issue 34, item 2): the gateway learns of us from it, and of our leaving
    beat = await announce(
        redis,
        args,
        "scheduler",
        args.instance_id,
        role=args.role,
        meta={"executor": args.executor},
        log=svc.log,
    )
    gc.collect()
    gc.freeze()  # long-lived startup objects leave the collector's scans (GC pauses hit p99)
    tasks += [asyncio.create_task(loop.run(svc, executor)),
              asyncio.create_task(store.flush_forever())]
    svc.log.info("serving", port=args.port, policy=dep.policy, role=args.role,
                 tbt_slo=dep.tbt_slo,
                 kv_blocks=desc.kv_capacity_blocks, coefficients=svc.coefficients.version)

    async def leave() -> None:
        await beat.leave()
        await svc.draining()
        await drain(svc, args.drain_timeout)

    try:
        await rpc.serve_until_signal(server, tasks, before_stop=leave)
    finally:
        await store.close(2.0)
        await redis.aclose()


async def drain(svc: SchedulerService, timeout: float, every: float = 0.05) -> None:
    """A clean stop, once deregistered: serve on while the gateway (or the router, for
    several frontends) moves our requests elsewhere (the Controller's instance-left
    transition re-runs them and cancels them here), until none is left, no gateway or
    frontend is connected, or ``timeout`` s have passed."""
    loop_time = asyncio.get_running_loop().time
    start, held = loop_time(), len(svc.specs)
    while svc.specs and (svc.outq is not None or svc.streams.frontends) \
            and loop_time() - start < timeout:
        await asyncio.sleep(every)
    svc.log.info(
        "drained", requests=held, left=len(svc.specs), seconds=round(loop_time() - start, 3)
    )


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("scheduler")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--role", default="lp", choices=("lp", "hp"))
    p.add_argument("--executor", required=True, help="executor address host:port")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--drain-timeout", type=number(float, 0, strict=False), default=30.0,
                   metavar="SECONDS",
                   help="on SIGTERM: deregister, then wait at most this long for the gateway "
                        "to move our requests elsewhere")
    p.add_argument("--coefficients-wait", type=float, default=20.0,
                   help="seconds to wait at startup for the perf model's first fit")
    p.add_argument("--clock", choices=("wall", "virtual"), default="wall",
                   help="virtual: the simulator's event clock (protocol tests, with a "
                        "virtual-clock sim executor)")
    p.add_argument("--decision-log", default=None,
                   help="append every batch plan to this file as JSON lines")
    p.add_argument("--hang-factor", type=float, default=HANG_FACTOR,
                   help="a batch not back by factor x its predicted time + --hang-slack is a hang "
                        "(no deadline with --clock virtual: results wait for the conductor)")
    p.add_argument("--hang-slack", type=float, default=HANG_SLACK_S,
                   help="seconds added to every batch's hang deadline")
    p.add_argument("--stream-interval", type=number(int, 1, strict=False), default=1, metavar="N",
                   help="the frontends' --stream-interval (vLLM's stream_interval): a "
                        "frontend's tokens leave here together every N iterations, a first "
                        "or last token, an offload or a drop at once (scheduler.coalesce)")
    # the Deployment: handed whole (--deployment / $SLOSERVE_DEPLOYMENT), each flag overrides;
    # --tbt-slo is the gateway's, whose token budget and slack's tail_tbt follow from it;
    # --overlap unset: on (SGLang's choice; $SLOSERVE_OVERLAP=0 turns it off; always off
    # with --clock virtual; docs/lab/live-stack.md)
    add_deployment_arg(p)
    deployment_flags.add_flags(
        p, ("policy", "hp_instances", "prefix_caching", "overlap", "perf_model", "tbt_slo"),
        aliases={"hp_instances": "--num-hp"}, zero_is_none=True)
    admission_flags.add_flags(p)
    add_policy_flags(p)
    return p


def deployment_of(args: argparse.Namespace) -> Deployment:
    """The Deployment this scheduler runs: the one it was handed, the flags laid over it
    (knob flags over its policy config, admission flags over its limits)."""
    base = base_deployment(args)
    policy = args.policy or base.policy
    config = config_from_args(policy, args,
                              base=base.policy_config if policy == base.policy else None)
    # one scheduler sees one instance: a --num-hp past a handed fleet's size (compose and
    # Kubernetes may pass it alone) means at least one LP beside the HPs
    hp = base.hp_instances if args.hp_instances is None else args.hp_instances
    instances = base.instances if base.instances > hp else hp + 1
    dep = deployment_from_args(args, base, policy_config=config, instances=instances)
    return replace(dep, admission=admission_flags.limits_from_args(args, base.admission))


def policy_of(dep: Deployment, role: str) -> Policy:
    """The policy one ``role`` instance of ``dep`` runs: its config resolved under the
    deployment's TBT SLO (as ``simulate`` resolves it), then the role's rules applied."""
    return get_spec(dep.policy).make(role, dep.resolved_policy_config(),
                                     num_hp=dep.hp_instances)


def admission_from_args(args: argparse.Namespace) -> Admission | None:
    """What this scheduler enforces: the flags' limits, for its deployment."""
    dep = deployment_of(args)
    return None if dep.admission is None else for_deployment(dep.admission, dep.hp_instances)


def hang_from_args(args: argparse.Namespace) -> HangDeadline:
    """The hang deadline the flags ask for; a bad value names its flag."""
    try:
        return HangDeadline(args.hang_factor, args.hang_slack)
    except ValueError as exc:
        msg = str(exc).replace("hang_slack_s", "--hang-slack").replace("hang_factor",
                                                                       "--hang-factor")
        raise ValueError(msg) from None


def policy_from_args(args: argparse.Namespace) -> Policy:
    """The policy this instance runs: the knob flags' config, the role's rules applied."""
    return policy_of(deployment_of(args), args.role)


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
