"""``TorchEngine`` driven by real scheduler objects (Instance, BlockManager, policies)."""

from __future__ import annotations

import pytest

from sloserve.batch import BatchPlan, BatchShape, ScheduledItem
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.model.engine import TorchEngine
from sloserve.model.sampling import SamplingParams
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.policies.sarathi import SarathiConfig
from sloserve.request import Request

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = {"a": list(range(10, 47)), "b": list(range(300, 309)), "c": [7] * 23}


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    return TorchEngine("tiny", num_blocks=64, block_size=8, seed=0)


def generate(engine: TorchEngine, chunk: int, max_tokens: int = 6) -> dict[str, list[int]]:
    """All prompts together: prefill in ``chunk``-token pieces, then batched decodes."""
    kv = BlockManager(engine.num_blocks, engine.block_size)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    total = {rid: len(p) for rid, p in PROMPTS.items()}
    done = {rid: 0 for rid in PROMPTS}
    out: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    for rid, p in PROMPTS.items():
        engine.add_request(rid, p, params)
    while any(len(o) < max_tokens for o in out.values()):
        items = []
        for rid in PROMPTS:
            if len(out[rid]) >= max_tokens:
                continue
            n = min(chunk, total[rid] - done[rid])
            kv.allocate(rid, done[rid] + n)
            items.append(ScheduledItem(rid, n, done[rid], is_prefill=not out[rid]))
        tables = {rid: kv.block_table(rid) for rid in kv.holders()}
        result = engine.execute(BatchPlan(items), tables)
        for item in items:
            done[item.request_id] += item.num_tokens
        for rid, tok in result.tokens.items():
            out[rid].append(tok)
            total[rid] += 1
        assert result.duration_s > 0
    for rid in PROMPTS:
        engine.free(rid)
    return out


def test_chunk_size_does_not_change_generated_tokens(engine: TorchEngine) -> None:
    whole = generate(engine, chunk=64)
    assert generate(engine, chunk=5) == whole
    assert generate(engine, chunk=3) == whole  # 37 = 12*3 + 1: a one-token prefill chunk


def test_recompute_after_preemption_continues_the_same_tokens(engine: TorchEngine) -> None:
    want = generate(engine, chunk=64)["a"]
    kv = BlockManager(engine.num_blocks, engine.block_size)
    engine.add_request("p", PROMPTS["a"], GREEDY)
    ids = list(PROMPTS["a"])
    computed, got = 0, []
    for step in range(6):
        if step == 3:  # preempted: blocks freed, next prefill covers prompt + generated
            kv.free("p")
            engine.preempted("p")
            computed = 0
        n = len(ids) - computed
        kv.allocate("p", len(ids))
        result = engine.execute(BatchPlan([ScheduledItem("p", n, computed, n > 1)]),
                                {"p": kv.block_table("p")})
        computed = len(ids)
        ids.append(result.tokens["p"])
        got.append(result.tokens["p"])
    engine.free("p")
    assert got == want


def test_engine_serves_an_instance_running_the_sarathi_policy(engine: TorchEngine) -> None:
    """Chunked prefills mixed with decodes, as the scheduler plans them."""
    want = generate(engine, chunk=64)
    inst = Instance("lp0", get_spec("sarathi").make("lp", SarathiConfig(token_budget=16)),
                    BlockManager(engine.num_blocks, engine.block_size), LinearPerfModel())
    for rid, prompt in PROMPTS.items():
        inst.add_request(Request(rid, 0.0, len(prompt), 6), now=0.0)
        engine.add_request(rid, prompt, GREEDY)
    got: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    now, mixed = 0.0, False
    while inst.has_work:
        plan, _, _ = inst.schedule(now)
        mixed |= bool(plan.num_prefill_tokens and plan.num_decode_tokens)
        result = engine.execute(plan, {r: inst.kv.block_table(r) for r in inst.kv.holders()})
        now += result.duration_s
        for event in inst.complete(plan, now, result.stopped):
            got[event.request_id].append(result.tokens[event.request_id])
            if event.finished:
                engine.free(event.request_id)
    assert mixed and got == want


def _step(
    eng: TorchEngine, rid: str, prompt: list[int], params: SamplingParams
) -> tuple[int, bool]:
    """Prefill ``prompt`` as request ``rid``; (sampled token, whether it stopped)."""
    eng.add_request(rid, prompt, params)
    result = eng.execute(BatchPlan([ScheduledItem(rid, len(prompt), 0, True)]), {rid: [0]})
    return result.tokens[rid], rid in result.stopped


def test_stops_on_stop_id_eos_stop_string_and_max_tokens() -> None:
    eng = TorchEngine("tiny", num_blocks=16, block_size=8)
    prompt = [1, 2, 3]
    first, stopped = _step(eng, "probe", prompt, SamplingParams(temperature=0.0, ignore_eos=True))
    assert not stopped
    assert _step(eng, "id", prompt, SamplingParams(temperature=0.0, stop_token_ids=(first,))) == (
        first, True)
    eng.tokenizer.eos_token_ids = (first,)  # this model's EOS is now the greedy token
    assert _step(eng, "eos", prompt, SamplingParams(temperature=0.0))[1]
    assert not _step(eng, "ign", prompt, SamplingParams(temperature=0.0, ignore_eos=True))[1]
    text = eng.tokenizer.decode([first])
    assert text  # byte tokenizer: the tiny preset's ids < 256 are bytes
    assert _step(eng, "str", prompt, SamplingParams(temperature=0.0, stop=(text,),
                                                     ignore_eos=True))[1]
    assert _step(eng, "max", prompt, SamplingParams(temperature=0.0, max_tokens=1,
                                                     ignore_eos=True))[1]


def test_bad_plans_raise_and_change_nothing(engine: TorchEngine) -> None:
    engine.add_request("v", [5, 6, 7, 8], GREEDY)
    with pytest.raises(ValueError, match="unknown request 'zz'"):
        engine.execute(BatchPlan([ScheduledItem("zz", 1, 0, True)]), {"zz": [0]})
    with pytest.raises(ValueError, match="inconsistent"):  # context not yet computed
        engine.execute(BatchPlan([ScheduledItem("v", 2, 2, True)]), {"v": [0]})
    with pytest.raises(ValueError, match="inconsistent"):  # more tokens than it has
        engine.execute(BatchPlan([ScheduledItem("v", 5, 0, True)]), {"v": [0]})
    with pytest.raises(ValueError, match="block_table: request v"):
        engine.execute(BatchPlan([ScheduledItem("v", 4, 0, True)]), {})
    with pytest.raises(ValueError, match="block id outside"):
        engine.execute(BatchPlan([ScheduledItem("v", 4, 0, True)]), {"v": [64]})
    with pytest.raises(ValueError, match="already added"):
        engine.add_request("v", [1], GREEDY)
    with pytest.raises(ValueError, match="outside vocab"):
        engine.add_request("w", [512], GREEDY)
    with pytest.raises(ValueError, match="exceeds the model context"):
        engine.add_request("w", [1], SamplingParams(max_tokens=2048))
    result = engine.execute(BatchPlan([ScheduledItem("v", 4, 0, True)]), {"v": [3]})
    assert list(result.tokens) == ["v"]
    engine.free("v")


def test_profile_batch_runs_any_shape_and_leaves_no_request(engine: TorchEngine) -> None:
    shape = BatchShape(prefills=((20, 30), (7, 0)), decodes=(5, 40, 1))
    assert engine.profile_batch(shape) > 0
    assert engine.profile_batch(BatchShape(decodes=(3,))) > 0
    with pytest.raises(ValueError, match="KV blocks"):
        engine.profile_batch(BatchShape(decodes=(600,)))
    with pytest.raises(ValueError, match="unknown request"):
        engine.output_ids("__profile_0")
