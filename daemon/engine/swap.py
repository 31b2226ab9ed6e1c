"""Swap preemption: a host (CPU) KV pool, mirroring the device's, that running sequences' blocks are
copied out to and back (`kernels.copy_blocks`).
"""

from __future__ import annotations

from collections.abc import MutableSequence

import torch

from radixd import kernels
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.sequence import Sequence
from radixd.daemon.executor.runner import ModelRunner


class HostSwap:
    """Host pool of `num_blocks` usable blocks mirroring `runner`'s device caches."""

    def __init__(self, runner: ModelRunner, num_blocks: int) -> None:
        self.runner = runner
        # NOTE: a host block has exactly one owner and is never shared or cached: a free list suffices.
        self._free = list(range(num_blocks - 1, -1, -1))
        shape = (num_blocks, *runner.k_caches[0].shape[1:])
        dtype = runner.k_caches[0].dtype
        self.k = [torch.zeros(shape, dtype=dtype) for _ in runner.k_caches]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in runner.v_caches]
        self.swapped_out_blocks = 0
        self.swapped_in_blocks = 0

    @property
    def num_free(self) -> int:
        """Host blocks not holding a swapped-out sequence's KV."""
        return len(self._free)

    def can_hold(self, seq: Sequence, kv: KVManager) -> bool:
        return seq.table is not None and len(self._free) >= len(kv.kv_blocks(seq))

    def _copy(
        self,
        src: tuple[list[torch.Tensor], list[torch.Tensor]],
        dst: tuple[list[torch.Tensor], list[torch.Tensor]],
        src_blocks: MutableSequence[int],
        dst_blocks: MutableSequence[int],
        counts: list[int],
    ) -> None:
        """Copy the first `counts[i]` tokens of block `src_blocks[i]` into `dst_blocks[i]`, in every lane."""
        if not src_blocks:
            return
        if src[0][0].device == dst[0][0].device:
            rows = list(zip(src_blocks, dst_blocks, counts, strict=True))
            ops = torch.tensor(rows, dtype=torch.int64, device=src[0][0].device)
            kernels.copy_blocks(src[0], src[1], dst[0], dst[1], ops)
            return
        # Across devices (GPU <-> host): whole-block index copies; the unused tail of a block is harmless.
        si = torch.tensor(src_blocks, dtype=torch.int64, device=src[0][0].device)
        di = torch.tensor(dst_blocks, dtype=torch.int64, device=dst[0][0].device)
        for s_cache, d_cache in zip(src[0] + src[1], dst[0] + dst[1], strict=True):
            d_cache.index_copy_(0, di, s_cache.index_select(0, si).to(d_cache.device))

    def swap_out(self, seq: Sequence, kv: KVManager) -> int:
        """Copy `seq`'s computed KV to host blocks and drop its device table; -> device blocks freed."""
        if seq.table is None:
            return 0
        n = seq.num_computed
        held = kv.kv_blocks(seq)  # its blocks, then (sliding layers) its window's pages
        if len(held) > len(self._free):
            raise RuntimeError(
                f"swap_out needs {len(held)} host blocks, {len(self._free)} free; see can_hold"
            )
        host = [self._free.pop() for _ in range(len(held))]
        dev, counts = [b for b, _ in held], [c for _, c in held]
        self._copy((self.runner.k_caches, self.runner.v_caches), (self.k, self.v), dev, host, counts)
        seq.host_blocks = host
        freed = kv.release(seq)
        seq.num_computed = n  # the KV of tokens[:n] lives on the host now
        self.swapped_out_blocks += len(host)
        return freed

    def swap_in(self, seq: Sequence, kv: KVManager) -> None:
        """Give `seq` fresh device blocks holding its host KV back (the caller ensured they are free)."""
        kv.resume(seq, seq.num_computed)
        kv.lease_new_path(seq)
        held = kv.kv_blocks(seq)
        if len(held) != len(seq.host_blocks):
            raise RuntimeError(f"swap_in: {len(seq.host_blocks)} host blocks for {len(held)} device blocks")
        dev, counts = [b for b, _ in held], [c for _, c in held]
        self._copy(
            (self.k, self.v), (self.runner.k_caches, self.runner.v_caches), seq.host_blocks, dev, counts
        )
        self.drop(seq)
        self.swapped_in_blocks += len(dev)

    def drop(self, seq: Sequence) -> None:
        """Free `seq`'s host blocks (after swap-in, or when a swapped request ends)."""
        self._free.extend(seq.host_blocks)
        seq.host_blocks = []
