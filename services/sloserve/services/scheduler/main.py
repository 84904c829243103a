"""``python -m sloserve.services.scheduler``: build the instance and serve it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os

from sloserve.admission import Admission, for_deployment
from sloserve.health import HANG_FACTOR, HANG_SLACK_S, HangDeadline
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.kv_prefix import PrefixCachingBlockManager
from sloserve.policies import Policy, get_spec, policy_names
from sloserve.policies.flags import add_policy_flags, config_from_args
from sloserve.services import admission_flags, obs, rpc
from sloserve.services.perfmodel.coefficients import Published, follow, regression_for
from sloserve.services.proto import SERVICE_NAMES, executor_grpc, executor_pb2, scheduler_grpc
from sloserve.services.redisconn import Outage, connect
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
    policy = policy_from_args(args)  # a bad knob fails before any connection
    admission = admission_from_args(args)
    hang = hang_from_args(args)
    redis = connect(args.redis_url)
    keys = Keys(args.prefix)
    executor = executor_grpc.ExecutorStub(rpc.channel(args.executor))
    # start-up progress: ``up`` reads these events from the log (issue 35)
    obs.setup_logging("scheduler").info("waiting_for_executor", executor=args.executor)
    desc = await _describe(executor, args.connect_timeout)
    perf_model = regression_for(desc.model, desc.hardware)  # roofline until the first fit
    if args.prefix_caching and desc.backend not in PREFIX_CACHING_BACKENDS:
        raise ValueError(f"--prefix-caching: the {desc.backend} executor cannot start a "
                         f"request over cached blocks (only {', '.join(PREFIX_CACHING_BACKENDS)})")
    kv_cls = PrefixCachingBlockManager if args.prefix_caching else BlockManager
    clock = make_clock(args.clock)
    instance = Instance(
        args.instance_id, policy, kv_cls(desc.kv_capacity_blocks, desc.block_size),
        perf_model, role=args.role, timers=not clock.virtual,  # an event clock has no timers
    )
    store = RequestStore(redis, keys, args.instance_id)
    log = open(args.decision_log, "a") if args.decision_log else None
    svc = SchedulerService(instance, store, args.policy, desc, clock, log,
                           admission, hang, overlap=args.overlap)
    store.live, store.outage.log = svc.live_requests, svc.log

    def apply(c: Published) -> None:
        perf_model.set_coefficients(c.values)
        svc.coefficients = c

    tasks = []
    if args.perf_model == "online":  # roofline: the uncalibrated model, frozen (tests)
        svc.log.info("waiting_for_perf_model", wait_s=args.coefficients_wait)
        tasks.append(await follow(redis, keys.coefficients, apply, wait_s=args.coefficients_wait,
                                  outage=Outage("coefficients", svc.log)))
    svc.restore(await store.outage.until_ok(store.restore))  # waits for Redis: never guess
    server, svc.health = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["scheduler"],
        lambda s: scheduler_grpc.add_SchedulerServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    gc.collect()
    gc.freeze()  # long-lived startup objects leave the collector's scans (GC pauses hit p99)
    tasks += [asyncio.create_task(loop.run(svc, executor)),
              asyncio.create_task(store.flush_forever())]
    svc.log.info("serving", port=args.port, policy=args.policy, role=args.role,
                 kv_blocks=desc.kv_capacity_blocks, coefficients=svc.coefficients.version)
    try:
        await rpc.serve_until_signal(server, tasks)
    finally:
        await store.close(2.0)
        await redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("scheduler")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--role", default="lp", choices=("lp", "hp"))
    p.add_argument("--policy", default="sarathi", choices=policy_names())
    p.add_argument("--num-hp", type=int, default=0,
                   help="HP instances in the deployment (an Ascendra LP offloads only if > 0)")
    p.add_argument("--executor", required=True, help="executor address host:port")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--coefficients-wait", type=float, default=20.0,
                   help="seconds to wait at startup for the perf model's first fit")
    p.add_argument("--clock", choices=("wall", "virtual"), default="wall",
                   help="virtual: the simulator's event clock (protocol tests, with a "
                        "virtual-clock sim executor)")
    p.add_argument("--perf-model", choices=("online", "roofline"), default="online",
                   help="online: follow the perf-model service's fits; roofline: never refit")
    p.add_argument("--decision-log", default=None,
                   help="append every batch plan to this file as JSON lines")
    p.add_argument("--prefix-caching", action="store_true",
                   help="share cached prompt-prefix KV blocks between requests (vLLM's "
                        "automatic prefix caching; torch, vllm and sim executors)")
    admission_flags.add_flags(p)
    p.add_argument("--hang-factor", type=float, default=HANG_FACTOR,
                   help="a batch not back by factor x its predicted time + --hang-slack is a hang "
                        "(no deadline with --clock virtual: results wait for the conductor)")
    p.add_argument("--hang-slack", type=float, default=HANG_SLACK_S,
                   help="seconds added to every batch's hang deadline")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("SLOSERVE_OVERLAP", "1") != "0",
                   help="decide and send plan k+1 while the executor runs plan k (default on, "
                        "SGLang's choice; $SLOSERVE_OVERLAP=0 turns the default off; always "
                        "off with --clock virtual). See docs/live-stack.md")
    add_policy_flags(p)
    return p


def admission_from_args(args: argparse.Namespace) -> Admission | None:
    """What this scheduler enforces: the flags' limits, for its deployment."""
    limits = admission_flags.limits_from_args(args)
    return None if limits is None else for_deployment(limits, args.num_hp)


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
    if args.num_hp < 0:
        raise ValueError(f"--num-hp: must be >= 0, got {args.num_hp}")
    return get_spec(args.policy).make(args.role, config_from_args(args.policy, args),
                                      num_hp=args.num_hp)


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
