"""Feed a backend the plans our scheduler would send, in-process (no gRPC).

``PlanDriver`` runs a real ``Instance`` (our policy + ``BlockManager``), stepped
by the core's ``InstanceDriver`` (``sloserve.driver``) as the scheduler steps it, and
turns each of its plans into the ``executor_pb2.BatchPlan`` the scheduler
service sends, with the same conversion (``convert.plan_to_proto``: items with
block tables as deltas, ``added`` for a sequence (re)starting at context 0 or over a
prefix-cache hit, ``preempted``, ``freed``). Used by the engine throughput
benchmark and the backend tests to measure and check the engine path alone.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from sloserve.driver import InstanceDriver, Outcome
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.kv_prefix import PrefixCachingBlockManager, token_hash_ids
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.request import SLO, Request
from sloserve.services.convert import TableDeltas, plan_to_proto
from sloserve.services.executor.backends import Backend
from sloserve.services.proto import common_pb2, executor_pb2


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
                 max_num_seqs: int = 256, num_blocks: int | None = None,
                 prefix_caching: bool = False) -> None:
        desc = backend.describe()
        blocks = num_blocks or desc.kv_capacity_blocks
        spec = get_spec(policy)
        knobs = {"token_budget": token_budget, "max_num_batched_tokens": token_budget,
                 "max_num_seqs": max_num_seqs}
        names = {f.name for f in dataclasses.fields(spec.config_cls)}
        cfg = spec.config_cls(**{k: v for k, v in knobs.items() if k in names})
        self.backend = backend
        kv_cls = PrefixCachingBlockManager if prefix_caching else BlockManager
        self.instance = Instance("drv0", spec.make("lp", cfg),
                                 kv_cls(blocks, desc.block_size), LinearPerfModel())
        self.driver = InstanceDriver(self.instance)
        self.specs: dict[str, common_pb2.RequestSpec] = {}
        self._freed: list[str] = []
        self.tables = TableDeltas()  # what the backend holds of each block table

    def submit(self, rid: str, prompt: list[int], max_tokens: int,
               sampling: common_pb2.Sampling | None = None, now: float = 0.0) -> None:
        self.specs[rid] = common_pb2.RequestSpec(
            request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens,
            sampling=sampling or common_pb2.Sampling())
        req = Request(rid, now, len(prompt), max_tokens, SLO(ttft=None, tbt=None))
        req.output_token_ids = []
        if self.instance.kv.prefix_caching:  # identity from the token ids, one per KV block
            req.hash_unit = self.instance.kv.block_size
            req.hash_ids = token_hash_ids(prompt, req.hash_unit)
        self.instance.add_request(req, now)

    def run(self, max_iterations: int = 1_000_000, record_plans: bool = False) -> DriveResult:
        inst = self.instance
        reqs = dict(inst.requests)
        plans: list[executor_pb2.BatchPlan] = []
        start = time.perf_counter()
        engine_s = 0.0
        iterations = 0
        while inst.has_work and iterations < max_iterations:
            now = time.perf_counter() - start
            plan, offloaded, dropped, _ = self.driver.decide(now)
            if offloaded or dropped:
                raise RuntimeError(f"plan_driver: policy offloaded/dropped {offloaded + dropped}")
            if plan is None:
                raise RuntimeError("plan_driver: the policy made an empty plan with work queued")
            iterations += 1
            freed, self._freed = self._freed, []
            msg = plan_to_proto(inst, plan, self.specs, iterations, now, freed, self.tables)
            if record_plans:
                plans.append(msg)
            flight = self.driver.launch(plan, now, now)  # the backend runs it in-process
            step = self.backend.execute(msg)
            engine_s += step.duration_s
            events = self.driver.land(flight, Outcome(time.perf_counter() - start, step.tokens,
                                                      step.stopped))
            self._freed += [ev.request_id for ev in events if ev.finished]
        if self._freed:  # let the executor forget the last finished requests too
            self.backend.execute(executor_pb2.BatchPlan(iteration=iterations + 1,
                                                        freed=self._freed))
            self._freed = []
        return DriveResult({r: list(req.output_token_ids or ()) for r, req in reqs.items()},
                           iterations, inst.num_preemptions, time.perf_counter() - start,
                           engine_s, plans)
