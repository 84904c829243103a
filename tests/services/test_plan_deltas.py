"""Plans carry block-table deltas (issue 14): the executor rebuilds every table exactly.

The scheduler's conversion (``convert.plan_to_proto`` with a ``TableDeltas``) and the
executor's ``BlockTables`` run against a real ``Instance`` (vLLM's policy, which
preempts by recompute when the KV cache is full, and Sarathi's chunked prefills),
one plan at a time, as over the Execute stream. After every plan the executor's
table of each item must equal the scheduler's ``BlockManager`` table; a steady decode
step carries no whole table; preemption, a lost executor (a new stream, its running
requests recomputed) and a re-run on another instance all start over with whole tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.request import SLO, Request
from sloserve.services.convert import TableDeltas, plan_to_proto, request_of
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.executor.block_tables import BlockTables
from sloserve.services.proto import common_pb2, executor_pb2

PROMPT, OUTPUT = 60, 40


def _instance(name: str, policy: str, num_blocks: int) -> Instance:
    spec = get_spec(policy)
    cfg = spec.config_cls(**({"token_budget": 64} if policy == "sarathi" else {}))
    return Instance(name, spec.make("lp", cfg), BlockManager(num_blocks, 16), LinearPerfModel())


@dataclass
class Pair:
    """One scheduler instance and the executor stream it drives."""

    inst: Instance
    deltas: TableDeltas = field(default_factory=TableDeltas)
    executor: BlockTables = field(default_factory=BlockTables)
    freed: list[str] = field(default_factory=list)
    plans: list[executor_pb2.BatchPlan] = field(default_factory=list)
    iteration: int = 0

    def step(self, specs: dict[str, common_pb2.RequestSpec]) -> None:
        inst = self.inst
        plan, offloaded, dropped = inst.schedule(float(self.iteration))
        assert not offloaded and not dropped and plan.items
        self.iteration += 1
        freed, self.freed = self.freed, []
        msg = plan_to_proto(inst, plan, specs, self.iteration, 0.0, freed, self.deltas)
        self.plans.append(msg)
        tables = self.executor.apply(msg)
        for it in msg.items:  # the executor's rebuilt table is the scheduler's
            assert tables[it.request_id] == inst.kv.block_table(it.request_id), it.request_id
        sampled = {i.request_id: pseudo_token(i.request_id, i.token_index)
                   for i in msg.items if i.samples_token}
        events = inst.complete(plan, float(self.iteration), (), sampled)
        self.freed += [ev.request_id for ev in events if ev.finished]

    def lose_executor(self) -> None:
        """The stream broke: a new one starts empty on both sides, running requests
        go back to recompute (the scheduler's ``executor_lost``)."""
        self.inst.preempt_all()
        self.deltas.reset()
        self.executor = BlockTables()
        self.freed = []


def _submit(inst: Instance, specs: dict[str, common_pb2.RequestSpec], n: int) -> None:
    for k in range(n):
        rid = f"{inst.instance_id}-{k}"
        specs[rid] = common_pb2.RequestSpec(request_id=rid, prompt_token_ids=[7] * PROMPT,
                                            max_tokens=OUTPUT)
        req = Request(rid, 0.0, PROMPT, OUTPUT, SLO(ttft=None, tbt=None))
        req.output_token_ids = []
        inst.add_request(req, 0.0)


def _whole(msg: executor_pb2.BatchPlan) -> set[str]:
    return {i.request_id for i in msg.items if i.block_table}


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_executor_tables_equal_the_schedulers_through_preemption_and_loss(policy: str) -> None:
    specs: dict[str, common_pb2.RequestSpec] = {}
    # 8 requests of up to 100 tokens (7 blocks each) on 36 blocks: decodes outgrow the
    # cache and the policy preempts by recompute
    a = Pair(_instance("a", policy, 36))
    _submit(a.inst, specs, 8)
    while not (len(a.plans) >= 40 and len(a.inst.running) >= 2):
        a.step(specs)
    assert any(p.preempted for p in a.plans)  # the policy's own preemptions
    a.lose_executor()
    while a.inst.has_work:
        a.step(specs)

    for prev, msg in zip(a.plans, a.plans[1:], strict=False):
        before = {i.request_id for i in prev.items}
        added = {s.request_id for s in msg.added}
        # an item the previous plan ran, not (re)started here, carries no whole table
        cont = {i.request_id for i in msg.items} & before - added - set(msg.preempted)
        assert not cont & _whole(msg)
        assert added <= _whole(msg)  # every (re)start sends its whole table
    steady = [p for p in a.plans if p.items and not p.added and not p.preempted
              and all(not i.is_prefill for i in p.items)]
    assert steady  # decode-only steps occurred ...
    for p in steady:  # ... and none of them resent a table; most sent no block at all
        assert not _whole(p)
    assert sum(1 for p in steady for i in p.items if not i.new_blocks) > \
        sum(1 for p in steady for i in p.items if i.new_blocks)


def test_a_request_rerun_on_another_instance_starts_with_its_whole_table() -> None:
    specs: dict[str, common_pb2.RequestSpec] = {}
    a, b = Pair(_instance("a", "sarathi", 200)), Pair(_instance("b", "sarathi", 200))
    _submit(a.inst, specs, 4)
    for _ in range(12):
        a.step(specs)
    moved = [r for r in a.inst.preempt_all() if r.num_generated]  # instance a is lost
    assert moved
    for req in moved:  # the gateway re-runs them on b with the tokens they have
        spec = specs[req.request_id]
        spec.generated_token_ids[:] = req.output_token_ids or []
        b.inst.add_request(request_of(spec), 1.0)
    b.step(specs)
    first = b.plans[0]
    assert {s.request_id for s in first.added} == _whole(first) == \
        {i.request_id for i in first.items}
    while b.inst.has_work:
        b.step(specs)


def test_an_item_without_a_table_the_executor_holds_is_refused() -> None:
    plan = executor_pb2.BatchPlan(iteration=3)
    plan.items.add(request_id="x", num_tokens=1, context_len=20, new_blocks=[4])
    with pytest.raises(ValueError, match="item x has no block_table"):
        BlockTables().apply(plan)
