"""The ``vllm`` backend on the real engine (vLLM's CPU build, SmolLM2-135M-Instruct, bf16).

One engine for the module, compiled as stock ``vllm serve`` runs it (the backend's
default; ``enforce_eager`` is the other mode), so the greedy-token checks below hold
for the compiled model and the variable batch shapes our plans give it. Plans are
built as the scheduler builds them (``PlanDriver``: our real ``Instance``, policy and
``BlockManager``), or by hand where a test needs an exact batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tokenizers import Tokenizer

from sloserve.kv import BlockManager
from sloserve.services.executor.plan_driver import PlanDriver
from sloserve.services.executor.vllm_backend import VllmBackend
from sloserve.services.proto import common_pb2, executor_pb2

GREEDY = common_pb2.Sampling(temperature=0.0, ignore_eos=True)
PROMPTS = {
    "a": "The capital of France is",
    "b": "Write a short poem about the sea and the wind, in four lines:",
    "c": "List three prime numbers greater than ten. Answer:",
    "d": "Question: what colour is the sky on a clear day? Answer:",
}


# the module fixture (building the compiled engine: 100-400 s on a busy 2-core machine) counts
# against the first test's timeout: more than pyproject's 300 s
pytestmark = pytest.mark.timeout(900)

@pytest.fixture(scope="module")
def backend() -> Iterator[VllmBackend]:
    b = VllmBackend("smollm2-135m", gpu="cpu")
    yield b
    b.engine.runner.shutdown()


@pytest.fixture(scope="module")
def tok(backend: VllmBackend) -> Tokenizer:
    return Tokenizer.from_str(backend.describe().tokenizer_json)


def ids(tok: Tokenizer, rid: str) -> list[int]:
    return list(tok.encode(PROMPTS[rid]).ids)


def drive(backend: VllmBackend, tok: Tokenizer, rids: list[str], max_tokens: int,
          policy: str, budget: int) -> dict[str, list[int]]:
    d = PlanDriver(backend, policy=policy, token_budget=budget)
    for rid in rids:
        d.submit(rid, ids(tok, rid), max_tokens, GREEDY)
    return d.run().tokens


def test_describe_reports_vllms_kv_geometry(backend: VllmBackend) -> None:
    desc = backend.describe()
    assert desc.backend == "vllm"
    assert desc.block_size % 32 == 0  # vLLM's CPU attention
    assert desc.kv_capacity_blocks == backend.engine.runner.num_blocks > 100
    assert "<|im_end|>" in desc.tokenizer_json
    # vLLM's compiled model, as stock vllm serve (CPU: dynamo traced once + inductor)
    assert backend.engine.runner.compilation != "eager"


def test_greedy_paris(backend: VllmBackend, tok: Tokenizer) -> None:
    out = drive(backend, tok, ["a"], 4, "vllm", 2048)["a"]
    assert tok.decode(out).startswith(" Paris")


def test_mixed_chunked_batches_give_the_unchunked_greedy_tokens(
    backend: VllmBackend, tok: Tokenizer
) -> None:
    rids = list(PROMPTS)
    alone = {r: drive(backend, tok, [r], 12, "vllm", 2048)[r] for r in rids}
    # sarathi with an 8-token budget: prompts split into several chunks, batched with
    # the other requests' chunks and decodes (checked below), block tables growing
    d = PlanDriver(backend, policy="sarathi", token_budget=8)
    for r in rids:
        d.submit(r, ids(tok, r), 12, GREEDY)
    res = d.run(record_plans=True)
    chunked = res.tokens
    mixed = [p for p in res.plans if any(i.is_prefill for i in p.items) and len(p.items) > 1]
    assert any(sum(i.is_prefill for i in p.items) >= 2 for p in mixed)  # several chunks
    assert any(any(not i.is_prefill for i in p.items) for p in mixed)  # chunks + decodes
    assert chunked == alone


def test_preemption_recomputes_and_continues_the_same_tokens(
    backend: VllmBackend, tok: Tokenizer
) -> None:
    want = drive(backend, tok, ["b"], 10, "vllm", 2048)["b"]
    prompt = ids(tok, "b")
    kv = BlockManager(backend.engine.num_blocks, backend.engine.block_size)
    got: list[int] = []

    def step(ctx: int, n: int, added: bool = False, preempted: bool = False) -> None:
        kv.allocate("p", ctx + n)
        plan = executor_pb2.BatchPlan(preempted=["p"] if preempted else [])
        if added:
            plan.added.add(request_id="p", prompt_token_ids=prompt, max_tokens=10,
                           sampling=GREEDY)
        plan.items.add(request_id="p", num_tokens=n, context_len=ctx, is_prefill=ctx < 1,
                       block_table=kv.block_table("p"))
        res = backend.execute(plan)
        got.extend(res.tokens.values())

    step(0, len(prompt), added=True)
    for k in range(3):
        step(len(prompt) + k, 1)
    # preempted: the KV is freed; the next plan recomputes prompt + 4 tokens at new blocks
    kv.free("p")
    kv.allocate("other", 3 * backend.engine.block_size)  # so the new table differs from the old
    total = len(prompt) + len(got)
    step(0, total - 5, preempted=True)  # the recompute, chunked
    step(total - 5, 5)
    while len(got) < 10:
        step(len(prompt) + len(got) - 1, 1)
    backend.execute(executor_pb2.BatchPlan(freed=["p"]))
    assert got == want


def test_freed_ids_can_be_reused_and_sampling_is_honoured(
    backend: VllmBackend, tok: Tokenizer
) -> None:
    # same id twice: the second run must not see the first one's state
    first = drive(backend, tok, ["c"], 6, "vllm", 2048)["c"]
    assert drive(backend, tok, ["c"], 6, "vllm", 2048)["c"] == first
    seeded = common_pb2.Sampling(temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)

    def sample(seed_msg: common_pb2.Sampling) -> list[int]:
        d = PlanDriver(backend, policy="vllm", token_budget=2048)
        d.submit("s", ids(tok, "d"), 12, seed_msg)
        return d.run().tokens["s"]

    assert sample(seeded) == sample(seeded)  # a seed makes sampling reproducible
    # a stop id ends the request when it is sampled
    stop = first[2]
    d = PlanDriver(backend, policy="vllm", token_budget=2048)
    d.submit("t", ids(tok, "c"), 6, common_pb2.Sampling(temperature=0.0, ignore_eos=True,
                                                       stop_token_ids=[stop]))
    assert d.run().tokens["t"] == first[:first.index(stop) + 1]


def test_bad_plans_raise_naming_the_request(backend: VllmBackend, tok: Tokenizer) -> None:
    prompt = ids(tok, "a")
    plan = executor_pb2.BatchPlan()
    plan.items.add(request_id="ghost", num_tokens=3, context_len=0, block_table=[0])
    with pytest.raises(ValueError, match="ghost"):
        backend.execute(plan)
    plan = executor_pb2.BatchPlan()
    plan.added.add(request_id="x", prompt_token_ids=prompt, max_tokens=4, sampling=GREEDY)
    plan.items.add(request_id="x", num_tokens=len(prompt), context_len=0,
                   block_table=[backend.engine.num_blocks])
    with pytest.raises(ValueError, match="block_table: request x has a block id outside"):
        backend.execute(plan)
    plan = executor_pb2.BatchPlan()
    plan.items.add(request_id="x", num_tokens=len(prompt), context_len=2, block_table=[0])
    with pytest.raises(ValueError, match="inconsistent"):
        backend.execute(plan)
    backend.execute(executor_pb2.BatchPlan(freed=["x"]))


def test_prefix_cache_hit_reuses_our_blocks_and_gives_the_uncached_greedy_tokens(
    backend: VllmBackend, tok: Tokenizer
) -> None:
    shared = ids(tok, "b") * 20  # two or more full blocks of vLLM's CPU block size (128)
    prompts = {"first": shared + ids(tok, "a"), "second": shared + ids(tok, "c")}
    d = PlanDriver(backend, policy="sarathi", token_budget=2048, prefix_caching=True)
    d.submit("first", prompts["first"], 6, GREEDY)
    d.run()
    d.submit("second", prompts["second"], 6, GREEDY)  # the first's prompt blocks are cached
    res = d.run(record_plans=True)
    bs = backend.describe().block_size
    hit = len(shared) // bs * bs
    first_item = res.plans[0].items[0]
    assert hit >= bs and (first_item.context_len, first_item.num_tokens) == (
        hit, len(prompts["second"]) - hit)
    alone = PlanDriver(backend, policy="sarathi", token_budget=2048)
    alone.submit("second", prompts["second"], 6, GREEDY)
    assert res.tokens["second"] == alone.run().tokens["second"]
