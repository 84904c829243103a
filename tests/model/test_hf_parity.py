"""Logits match Hugging Face ``LlamaForCausalLM`` on the same random weights.

The checkpoint is written by ``save_pretrained`` (config.json + safetensors)
and read by our loader; the prompt is run in two chunks through the paged
cache. Skips when ``transformers`` (test extra) is absent. Tolerance:
float32, atol 1e-4 on logits (observed ~1e-6).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sloserve.model.attention import build_metadata
from sloserve.model.kv_cache import PagedKVCache
from sloserve.model.llama import LlamaModel
from sloserve.model.loader import load_checkpoint, load_into

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
CPU = torch.device("cpu")
BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6)


@pytest.mark.parametrize(
    "extra",
    [
        {"rope_theta": 10000.0, "tie_word_embeddings": False},
        {"rope_theta": 500000.0, "tie_word_embeddings": True,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        {"rope_theta": 10000.0, "tie_word_embeddings": False,
         "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    ],
    ids=["untied", "tied-llama3-rope", "linear-rope"],
)
def test_logits_match_transformers_llama(tmp_path: Path, extra: dict[str, object]) -> None:
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BASE, **extra)).eval()
    hf.save_pretrained(tmp_path)
    tokens = torch.randint(0, 300, (70,))
    with torch.no_grad():
        want = hf(tokens[None]).logits[0]

    ckpt = load_checkpoint(tmp_path)
    assert ckpt.config.shape.tie_embeddings == extra["tie_word_embeddings"]
    model = LlamaModel(ckpt.config)
    load_into(model, ckpt.state_dict, str(tmp_path))
    s = ckpt.config.shape
    cache = PagedKVCache(s.num_layers, 8, 16, s.num_kv_heads, ckpt.config.head_dim,
                         torch.float32, CPU)
    table = [7, 2, 5, 0, 3]
    got = []
    with torch.inference_mode():
        for start, end in ((0, 33), (33, 70)):
            meta = build_metadata([(start, end - start, table)], 16, CPU, use_flash=False)
            hidden = model(tokens[start:end], torch.arange(start, end), cache, meta)
            got.append(model.logits(hidden))
    torch.testing.assert_close(torch.cat(got), want, atol=ATOL, rtol=0)
