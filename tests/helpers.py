"""Small builders shared by policy tests (real core objects, nothing mocked)."""

from __future__ import annotations

from typing import Any

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import Policy, get_spec
from sloserve.request import SLO, Request

# one policy class per name; Ascendra's two roles by "ascendra-<role>"
CLASSES: dict[str, type[Policy]] = {
    **{n: get_spec(n).roles["lp"] for n in ("vllm", "sarathi", "accelgen")},
    **{f"ascendra-{r}": c for r, c in get_spec("ascendra").roles.items()},
}


def make_policy(name: str, **knobs: Any) -> Policy:
    """The policy class itself with its config from ``knobs`` (no role rules applied)."""
    cls = CLASSES[name]
    return cls(cls.config_cls(**knobs))


def make_instance(policy: str, num_blocks: int = 1000, block_size: int = 16,
                  role: str = "lp", **knobs: Any) -> Instance:
    return Instance(f"{role}0", make_policy(policy, **knobs),
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
