"""Wire size and build time of a steady decode plan, block tables whole vs as deltas.

One Sarathi instance (core ``Instance``, no services) with ``--requests`` requests
of ``--prompt-len`` + ``--max-tokens`` tokens all running; every plan is converted
twice by ``convert.plan_to_proto``: with a fresh ``TableDeltas`` (the executor holds
nothing: every table whole, as before issue 14) and with one kept across plans (the
scheduler's deltas). Reports mean bytes and ms (build + serialise) per plan over the
last ``--measure`` iterations.

    python infra/bench/plan_size.py --requests 60
"""

from __future__ import annotations

import argparse
import json
import time

from sloserve.driver import InstanceDriver, Outcome
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.policies.sarathi import SarathiConfig
from sloserve.request import SLO, Request
from sloserve.services.convert import TableDeltas, plan_to_proto
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.proto import common_pb2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--measure", type=int, default=100)
    args = p.parse_args()
    inst = Instance("lp0", get_spec("sarathi").make("lp", SarathiConfig(token_budget=512)),
                    BlockManager(8000, 16), LinearPerfModel())
    specs = {}
    for k in range(args.requests):
        rid = f"r{k}"
        specs[rid] = common_pb2.RequestSpec(request_id=rid, max_tokens=args.max_tokens,
                                            prompt_token_ids=[7] * args.prompt_len)
        req = Request(rid, 0.0, args.prompt_len, args.max_tokens, SLO(ttft=None, tbt=None))
        req.output_token_ids = []
        inst.add_request(req, 0.0)
    driver = InstanceDriver(inst)  # the scheduler's step (sloserve.driver)
    deltas = TableDeltas()
    size = {"whole": 0, "delta": 0}
    took = {"whole": 0.0, "delta": 0.0}
    first = args.iterations - args.measure
    for it in range(args.iterations):
        plan, _, _, _ = driver.decide(float(it))
        assert plan is not None, "every request runs: the plan is never empty"
        for name, tables in (("whole", TableDeltas()), ("delta", deltas)):
            t0 = time.perf_counter()
            raw = plan_to_proto(inst, plan, specs, it, 0.0, [], tables).SerializeToString()
            if it >= first:
                took[name] += time.perf_counter() - t0
                size[name] += len(raw)
        reqs = [inst.requests[i.request_id] for i in plan.items]
        sampled = {r.request_id: pseudo_token(r.request_id, r.num_generated)
                   for r, i in zip(reqs, plan.items, strict=True)
                   if r.samples_after(i.num_tokens)}
        driver.land(driver.launch(plan, float(it), it + 1.0), Outcome(it + 1.0, sampled))
    assert plan is not None
    print(json.dumps({"items": len(plan.items), "context_len": plan.items[0].context_len,
                      **{f"{k}_bytes": size[k] / args.measure for k in size},
                      **{f"{k}_ms": took[k] / args.measure * 1e3 for k in took}}))


if __name__ == "__main__":
    main()
