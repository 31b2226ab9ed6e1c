"""Llama-family decoder whose attention reads and writes the paged KV pool through `radixd.kernels`."""

from radixd.daemon.model.config import ModelConfig
from radixd.daemon.model.llama import AttentionMetadata, LayerWeights, LlamaModel, LlamaWeights

__all__ = ["AttentionMetadata", "LayerWeights", "LlamaModel", "LlamaWeights", "ModelConfig"]
