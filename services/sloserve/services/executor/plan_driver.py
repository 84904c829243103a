"""Feed a backend the plans our scheduler would send, in-process (no gRPC).

``PlanDriver`` runs a real ``Instance`` (our policy + ``BlockManager``) and
turns each of its plans into the ``executor_pb2.BatchPlan`` the scheduler
service builds (``scheduler/server.py::_plan_msg``: items with block tables,
``added`` the first time a request reaches the executor, ``preempted``
(recompute: the executor keeps the tokens), ``freed``). Used by the engine throughput
benchmark and the backend tests to measure and check the engine path alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import make_policy
from sloserve.policies.base import PolicyConfig
from sloserve.request import SLO, Request
from sloserve.services.executor.backends import Backend
from sloserve.services.proto import common_pb2, executor_pb2


@dataclass(slots=True)
class _Rec:
    prompt: list[int]
    max_tokens: int
    sampling: common_pb2.Sampling
    tokens: list[int] = field(default_factory=list)
    on_executor: bool = False


@dataclass(slots=True)
class DriveResult:
    tokens: dict[str, list[int]]
    iterations: int
    preemptions: int
    wall_s: float  # the whole loop: scheduling, plan building, execution
    engine_s: float  # sum of the backend's measured step times
    plans: list[executor_pb2.BatchPlan] = field(default_factory=list)  # when recorded


class PlanDriver:
    def __init__(self, backend: Backend, policy: str = "sarathi", token_budget: int = 512,
                 max_num_seqs: int = 256, num_blocks: int | None = None) -> None:
        desc = backend.describe()
        blocks = num_blocks or desc.kv_capacity_blocks
        cfg = PolicyConfig(token_budget=token_budget, max_num_seqs=max_num_seqs)
        self.backend = backend
        self.instance = Instance("drv0", make_policy(policy, cfg),
                                 BlockManager(blocks, desc.block_size), LinearPerfModel())
        self.recs: dict[str, _Rec] = {}
        self._freed: list[str] = []

    def submit(self, rid: str, prompt: list[int], max_tokens: int,
               sampling: common_pb2.Sampling | None = None, now: float = 0.0) -> None:
        self.recs[rid] = _Rec(list(prompt), max_tokens, sampling or common_pb2.Sampling())
        self.instance.add_request(
            Request(rid, now, len(prompt), max_tokens, SLO(ttft=None, tbt=None)), now)

    def _msg(self, plan_items: list[tuple[str, int, int, bool]], preempted: list[str],
             iteration: int) -> executor_pb2.BatchPlan:
        msg = executor_pb2.BatchPlan(iteration=iteration, freed=self._freed)
        self._freed = []
        kv, reqs = self.instance.kv, self.instance.requests
        for rid, n, ctx, is_prefill in plan_items:
            rec, req = self.recs[rid], reqs[rid]
            msg.items.add(request_id=rid, num_tokens=n, context_len=ctx, is_prefill=is_prefill,
                          samples_token=ctx + n >= req.num_tokens, token_index=req.num_generated,
                          block_table=kv.block_table(rid))
            if not rec.on_executor:
                rec.on_executor = True
                msg.added.add(request_id=rid, prompt_token_ids=rec.prompt,
                              generated_token_ids=rec.tokens, max_tokens=rec.max_tokens,
                              sampling=rec.sampling)
        # as the scheduler: the executor keeps a preempted sequence's tokens and recomputes
        msg.preempted.extend(r for r in preempted if self.recs[r].on_executor)
        return msg

    def run(self, max_iterations: int = 1_000_000, record_plans: bool = False) -> DriveResult:
        inst = self.instance
        plans: list[executor_pb2.BatchPlan] = []
        start = time.perf_counter()
        engine_s = 0.0
        iterations = 0
        while inst.has_work and iterations < max_iterations:
            now = time.perf_counter() - start
            plan, offloaded, dropped = inst.schedule(now)
            if offloaded or dropped:
                raise RuntimeError(f"plan_driver: policy offloaded/dropped {offloaded + dropped}")
            if plan.is_empty:
                raise RuntimeError("plan_driver: the policy made an empty plan with work queued")
            iterations += 1
            items = [(i.request_id, i.num_tokens, i.context_len, i.is_prefill)
                     for i in plan.items]
            msg = self._msg(items, list(plan.preempted), iterations)
            if record_plans:
                plans.append(msg)
            step = self.backend.execute(msg)
            engine_s += step.duration_s
            for ev in inst.complete(plan, time.perf_counter() - start, step.stopped):
                rec = self.recs[ev.request_id]
                rec.tokens.append(step.tokens[ev.request_id])
                if ev.finished:
                    self._freed.append(ev.request_id)
        if self._freed:  # let the executor forget the last finished requests too
            self.backend.execute(executor_pb2.BatchPlan(iteration=iterations + 1,
                                                        freed=self._freed))
            self._freed = []
        return DriveResult({r: list(rec.tokens) for r, rec in self.recs.items()}, iterations,
                           inst.num_preemptions, time.perf_counter() - start, engine_s, plans)
