"""The ``torch`` executor's model: a Llama-architecture transformer with a paged KV cache.

``TorchEngine`` (``sloserve.model.engine``) is the one entry point the executor
service uses; the rest are its parts (config, weights, tokenizer, attention,
sampling). Importing this package does not import torch; its modules do.
"""
