"""Paged-attention kernels (Triton) and their torch reference twins, one op per file.

The model calls only these, each with ``backend: str | None = None`` (the rule: dispatch.py):
:func:`store_kv` (new K/V rows into pool slots ``block * B + offset``, -1 skips); :func:`paged_decode`;
:func:`paged_prefill`; :func:`copy_blocks` (CoW, device<->host swap); :func:`cpu_attention_design` (the
CPU attention in force; the first call builds the kernel); :func:`cpu_step_plan` (a step's rows for the
compiled CPU attention, checked once for every layer); :func:`host_kernels` (whether a device's work runs
the CPU-only pieces: the one switch between paths). Per-layer pool: ``k_cache``, ``v_cache`` each
``[num_blocks, block_size, num_kv_heads, head_dim]``.
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
