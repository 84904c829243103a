"""Weight loading from checkpoints written here: HF safetensors directories and GGUF files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenizers import pre_tokenizers

from sloserve.model.config import LlamaConfig
from sloserve.model.llama import LlamaModel
from sloserve.model.loader import load_checkpoint, load_into
from sloserve.perf.models import ModelShape

SHAPE = ModelShape("t", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                   intermediate_size=96, vocab_size=300, max_context=128, rope_theta=10000.0)

def random_model(tied: bool = False) -> LlamaModel:
    m = LlamaModel(LlamaConfig(dataclasses.replace(SHAPE, tie_embeddings=tied), rms_eps=1e-6))
    m.init_random(1)
    return m


def hf_config(tied: bool) -> dict[str, object]:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
            "vocab_size": 300, "max_position_embeddings": 128, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": tied, "eos_token_id": [5, 6]}


def write_hf_dir(path: Path, model: LlamaModel, tied: bool) -> None:
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    if "model.lm_head.weight" in state:
        state["lm_head.weight"] = state.pop("model.lm_head.weight")
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # old HF exports
    keys = sorted(state)
    save_file({k: state[k] for k in keys[: len(keys) // 2]}, str(path / "model-00001.safetensors"))
    save_file({k: state[k] for k in keys[len(keys) // 2 :]}, str(path / "model-00002.safetensors"))
    (path / "config.json").write_text(json.dumps(hf_config(tied)))


@pytest.mark.parametrize("tied", [False, True])
def test_hf_directory_with_sharded_safetensors_loads_every_weight(
    tmp_path: Path, tied: bool
) -> None:
    src = random_model(tied)
    write_hf_dir(tmp_path, src, tied)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.config.shape.tie_embeddings is tied
    assert ckpt.config.eos_token_ids == (5, 6)
    dst = LlamaModel(ckpt.config)
    load_into(dst, ckpt.state_dict, str(tmp_path))
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name
    assert (dst.lm_head.weight is dst.embed_tokens.weight) is tied


def test_hf_directory_errors_name_the_problem(tmp_path: Path) -> None:
    src = random_model()
    write_hf_dir(tmp_path, src, tied=False)
    cfg = hf_config(False)
    del cfg["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_checkpoint(tmp_path)
    write_hf_dir(tmp_path, src, tied=False)
    ckpt = load_checkpoint(tmp_path)
    ckpt.state_dict["layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.up_proj\.weight has shape"):
        load_into(LlamaModel(ckpt.config), ckpt.state_dict, "x")
    del ckpt.state_dict["norm.weight"]
    with pytest.raises(ValueError, match="missing tensors.*norm.weight"):
        load_into(LlamaModel(ckpt.config), ckpt.state_dict, "x")
    with pytest.raises(ValueError, match="neither"):
        load_checkpoint(tmp_path / "nope.bin")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="bad.gguf"):
        load_checkpoint(bad)


# --- GGUF -------------------------------------------------------------------------------
def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute`` (HF rotate-half -> interleaved rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape
    )


GGUF_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def vocab() -> tuple[list[str], list[str], list[int]]:
    """A byte-level BPE vocabulary of exactly 300 tokens with a few merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["t h", "th e", "Ġ the", "c a", "ca t"]
    tokens = alphabet + ["th", "the", "Ġthe", "ca", "cat", "<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    while len(tokens) < 300:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(1)
    return tokens, merges, types


def write_gguf(path: Path, model: LlamaModel, quantize: str = "") -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(SHAPE.num_layers)
    w.add_context_length(SHAPE.max_context)
    w.add_embedding_length(SHAPE.hidden_size)
    w.add_feed_forward_length(SHAPE.intermediate_size)
    w.add_head_count(SHAPE.num_heads)
    w.add_head_count_kv(SHAPE.num_kv_heads)
    w.add_rope_freq_base(SHAPE.rope_theta)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(16)
    tokens, merges, types = vocab()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|endoftext|>"))  # 261
    for name, tensor in model.state_dict().items():
        arr = tensor.numpy().astype(np.float32)
        if name in GGUF_NAMES:
            out = GGUF_NAMES[name]
        else:
            _, layer, *rest = name.split(".")
            out = f"blk.{layer}.{LAYER_NAMES['.'.join(rest[:-1])]}.weight"
        if name.endswith("q_proj.weight"):
            arr = llama_cpp_permute(arr, SHAPE.num_heads)
        elif name.endswith("k_proj.weight"):
            arr = llama_cpp_permute(arr, SHAPE.num_kv_heads)
        if quantize and name == quantize:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(out, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(out, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_loads_weights_and_undoes_the_llama_cpp_rope_permutation(tmp_path: Path) -> None:
    src = random_model()
    write_gguf(tmp_path / "m.gguf", src)
    ckpt = load_checkpoint(tmp_path / "m.gguf")
    s = ckpt.config.shape
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.vocab_size) == (
        2, 64, 4, 2, 300)
    assert not s.tie_embeddings and ckpt.config.rms_eps == pytest.approx(1e-6)
    dst = LlamaModel(ckpt.config)
    load_into(dst, ckpt.state_dict, "m.gguf")
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name


def test_gguf_quantized_tensor_is_dequantized(tmp_path: Path) -> None:
    src = random_model()
    name = "layers.0.mlp.up_proj.weight"
    write_gguf(tmp_path / "q.gguf", src, quantize=name)
    got = load_checkpoint(tmp_path / "q.gguf").state_dict[name]
    want = src.state_dict()[name]
    # Q8_0: blocks of 32 with one scale, max error half a step of max|w|/127
    step = want.abs().max() / 127
    assert (got - want).abs().max() <= step
    assert not torch.equal(got, want)


def test_gguf_embedded_tokenizer_encodes_with_its_merges(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", random_model())
    tok = load_checkpoint(tmp_path / "m.gguf").tokenizer
    assert tok is not None
    tokens = vocab()[0]
    ids = tok.encode("the cat")
    assert [tokens[i] for i in ids] == ["the", "Ġ", "cat"]
    assert tok.decode(tok.encode("the theory, 42 ü")) == "the theory, 42 ü"
    assert tok.eos_token_ids == (261,)
    assert tok.decode([ids[0], 261]) == "the"  # special tokens are not printed
