"""Small builders shared by policy tests (real core objects, nothing mocked)."""

from __future__ import annotations

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import make_policy
from sloserve.policies.base import PolicyConfig
from sloserve.request import SLO, Request


def make_instance(policy: str, num_blocks: int = 1000, block_size: int = 16,
                  role: str = "lp", **knobs: object) -> Instance:
    return Instance(f"{role}0", make_policy(policy, PolicyConfig(**knobs)),  # type: ignore[arg-type]
                    BlockManager(num_blocks, block_size), LinearPerfModel(), role=role)


def req(rid: str, prompt: int, output: int = 8, arrival: float = 0.0, ttft: float | None = 1.0,
        tbt: float | None = 0.1, priority: int = 0) -> Request:
    return Request(rid, arrival, prompt, output, SLO(ttft=ttft, tbt=tbt), priority=priority)


def run_until_done(inst: Instance, dt: float = 0.01, max_iters: int = 100_000) -> list:
    """Drive ``inst`` with a fixed iteration time; return the plans it produced."""
    plans = []
    now = 0.0
    for _ in range(max_iters):
        if not inst.has_work:
            break
        plan, _, _ = inst.schedule(now)
        plans.append(plan)
        now += dt
        inst.complete(plan, now)
    return plans
