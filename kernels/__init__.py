"""Paged-attention kernels (Triton) and their torch reference twins, one op per file.

Public API (the model calls only these; each takes ``backend: str | None = None``):

- :func:`store_kv` - write new K/V rows into pool slots (``slot = block * B + offset``, -1 skips).
- :func:`paged_decode` - one query token per sequence, split-K flash decoding over block tables.
- :func:`paged_prefill` - ragged new tokens attend to their cached prefix and causally to themselves.
- :func:`copy_blocks` - (src, dst, n_tokens) block copies over every layer (CoW, device<->host swap).
- :func:`cpu_attention_design` - the CPU attention in force ("compiled" or "split"); the first call
  builds the compiled kernel (cpu_attention.py).
- :func:`cpu_step_plan` - a whole step's rows (prefill tokens, then decode sequences) for the compiled
  CPU attention, checked once for every layer (the float32 native decoder's attention plan).
- :func:`host_kernels` - whether a device's work runs the CPU-only pieces (the one switch between paths).

Backend: ``backend`` argument, else env ``RADIXD_KERNEL_BACKEND``, else Triton for CUDA tensors,
else Triton under ``TRITON_INTERPRET=1``, else the torch twin (the daemon's CPU path).
Per-layer pool layout: ``k_cache``, ``v_cache`` each ``[num_blocks, block_size, num_kv_heads, head_dim]``.
"""

from radixd.kernels.copy_blocks import copy_blocks
from radixd.kernels.cpu_attention import design as cpu_attention_design
from radixd.kernels.cpu_attention import step_plan as cpu_step_plan
from radixd.kernels.dispatch import ENV_BACKEND, host_kernels, resolve_backend
from radixd.kernels.paged_decode import decode_step_plan, paged_decode
from radixd.kernels.paged_prefill import paged_prefill
from radixd.kernels.store_kv import store_kv

__all__ = [
    "ENV_BACKEND",
    "copy_blocks",
    "cpu_attention_design",
    "cpu_step_plan",
    "decode_step_plan",
    "host_kernels",
    "paged_decode",
    "paged_prefill",
    "resolve_backend",
    "store_kv",
]
