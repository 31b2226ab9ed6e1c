"""KV-cache memory model: bytes per token / per block for a model, and blocks that fit a budget.

A token takes 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes bytes; a block holds B tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixd.radix.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class KVSpec:
    """Shape of a model's KV cache plus the paging block size."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"KVSpec.{name} must be a positive integer, got {value!r}")

    @property
    def bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token occupies across all layers."""
        return self.num_layers * self.bytes_per_token_per_layer

    @property
    def bytes_per_block_per_layer(self) -> int:
        return self.block_size * self.bytes_per_token_per_layer

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one physical block across all layers."""
        return self.block_size * self.bytes_per_token

    def bytes_for_tokens(self, n_tokens: int) -> int:
        """Bytes a sequence of ``n_tokens`` occupies in whole blocks."""
        if n_tokens < 0:
            raise InvalidRequest(f"n_tokens must be >= 0, got {n_tokens}")
        return -(-n_tokens // self.block_size) * self.bytes_per_block

    def blocks_for_budget(self, budget_bytes: int) -> int:
        """Physical blocks that fit in ``budget_bytes`` (the pool's num_blocks, null block included)."""
        if budget_bytes < 0:
            raise InvalidRequest(f"budget_bytes must be >= 0, got {budget_bytes}")
        return budget_bytes // self.bytes_per_block

    def tokens_for_budget(self, budget_bytes: int) -> int:
        """Token slots in the usable blocks of a pool sized from ``budget_bytes`` (null block excluded)."""
        return max(0, self.blocks_for_budget(budget_bytes) - 1) * self.block_size


LLAMA3_8B = KVSpec(num_layers=32, num_kv_heads=8, head_dim=128)
LLAMA3_70B = KVSpec(num_layers=80, num_kv_heads=8, head_dim=128)
LLAMA2_70B = KVSpec(num_layers=80, num_kv_heads=64, head_dim=128)
