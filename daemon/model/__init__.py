"""Llama-family decoder whose attention reads and writes the paged KV pool through `radixd.kernels`."""

from radixd.daemon.model.config import ModelConfig
from radixd.daemon.model.kv_layout import KV_LAYOUTS, KVLayout
from radixd.daemon.model.llama import AttentionMetadata, LayerWeights, LlamaModel, LlamaWeights

__all__ = [
    "KV_LAYOUTS",
    "AttentionMetadata",
    "KVLayout",
    "LayerWeights",
    "LlamaModel",
    "LlamaWeights",
    "ModelConfig",
]
