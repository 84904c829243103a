"""The routing decision's CPU per request, in process (issue 33: capacity model).

Times what the gateway does per request on top of the token path, for a fleet of
``--instances``: the prefix identity of the prompt (``request_of`` with a hash unit,
only with ``--prefix-routing``), ``Controller.admit`` (round-robin, or the
``PrefixRouter``), the first and last token's bookkeeping (``on_tokens``), and one
instance state report per request. Requests are the multi-turn workload's, their
prompts built as ``sloserve bench`` builds them (``bench_cmd.prompt_ids``); the
prompts are built before the timing starts. CPU time (``time.process_time``), so the
figure is what the decisions cost, not how busy the machine was; still, this is one
process on whatever machine runs it: report the machine and its load beside it.

    python infra/bench/router_cost.py --instances 64 [--prefix-routing] [--policy ascendra]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from sloserve.controller import Controller
from sloserve.policies.registry import instance_roles
from sloserve.routing_prefix import PrefixRouter
from sloserve.services.bench_cmd import prompt_ids
from sloserve.services.convert import request_of
from sloserve.services.proto import common_pb2
from sloserve.workload.multiturn import multiturn_requests

BLOCK = 16  # the KV block size: the live prefix identity's unit


@dataclass(frozen=True, slots=True)
class Tok:
    request_id: str
    index: int
    finished: bool


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=64)
    p.add_argument("--hp-instances", type=int, default=0)
    p.add_argument("--policy", default="sarathi")
    p.add_argument("--prefix-routing", action="store_true")
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--kv-blocks", type=int, default=30000, help="per instance (router memory)")
    args = p.parse_args(argv)
    roles = instance_roles(args.policy, args.instances, args.hp_instances)
    router = (PrefixRouter([i for i, _ in roles], capacity_units=args.kv_blocks)
              if args.prefix_routing else None)
    ctl = Controller(roles, prefix_router=router)
    reqs = multiturn_requests(num_requests=args.num_requests, qps=50.0, seed=0,
                              max_context=4096).requests
    specs = [common_pb2.RequestSpec(request_id=r.request_id, prompt_token_ids=prompt_ids(r),
                                    max_tokens=r.output_len) for r in reqs]
    unit = BLOCK if args.prefix_routing else None
    t0 = time.process_time()
    for spec in specs:  # the prefix identity alone (the gateway computes it per request)
        request_of(spec, unit)
    identity = time.process_time() - t0
    t0 = time.process_time()
    for k, spec in enumerate(specs):
        req = request_of(spec, unit)
        action = ctl.admit(req, float(k))
        where = getattr(action, "instance_id", "")
        ctl.on_tokens([Tok(spec.request_id, 0, False)])
        ctl.on_instance_state(where, 0, float(k))
        ctl.on_tokens([Tok(spec.request_id, 1, True)])
    cpu = time.process_time() - t0
    print(json.dumps({
        "instances": args.instances, "policy": args.policy,
        "prefix_routing": args.prefix_routing, "requests": len(specs),
        "mean_prompt_tokens": round(sum(len(s.prompt_token_ids) for s in specs) / len(specs)),
        "cpu_us_per_request": round(cpu / len(specs) * 1e6, 1),
        "of_which_prefix_identity_us": round(identity / len(specs) * 1e6, 1),
        "routed_to_match": router.num_matched if router else None,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
