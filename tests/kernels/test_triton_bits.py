"""The Triton decode and prefill kernels' outputs, bit for bit, under TRITON_INTERPRET=1.

The digests were recorded from the kernels before their shared online-softmax helper
(`paged_decode._split_softmax`, `_fold_split`) replaced the loop each kernel wrote out: any change to
the order or the expressions of that arithmetic changes a digest.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from kernels_ref import make_pool

from radixd.kernels import paged_decode, paged_prefill

HKV, D, B = 2, 16, 8
# (pool dtype, query heads, split keys) -> sha256 of the outputs' bytes (decode, then prefill)
DIGESTS = {
    ("float32", 4, None): "a00873dc75ef845869c563226cc170e5b1c05973935745bafbed6964dd7d5827",
    ("float16", 4, 64): "a354f2f002db26379f2b30ac64b6ed7d72ba777a8a7aaba3d59ddfc062f7a1aa",
    ("bfloat16", 2, 64): "c52181c54a3dd6ac12842685f0bd5e43ac05f2808026eab86d574c308068bf73",
    ("float32", 6, 64): "989112759bb4574630454f67a89a84b0a60d881237fc6e569c1ddb71d8f8756c",
}
CASES = list(DIGESTS)


def _outputs(dtype: torch.dtype, hq: int, split: int | None) -> bytes:
    lens = [150, 70, 1, 0]
    pool = make_pool(lens, B, HKV, D, dtype=dtype, seed=5)
    g = torch.Generator().manual_seed(7)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), hq, D, generator=g).to(dtype)
    dec = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, D**-0.5, split, backend="triton")
    q_lens = [90, 70, 1, 0]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    qp = torch.randn(sum(q_lens), hq, D, generator=g).to(dtype)
    pre = paged_prefill(qp, pool.k, pool.v, pool.block_tables, cu, seq_lens, D**-0.5, backend="triton")
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in (dec, pre))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-hq{c[1]}-split{c[2]}")
def test_outputs_bitwise_unchanged(interpret: None, case: tuple[str, int, int | None]) -> None:
    name, hq, split = case
    digest = hashlib.sha256(_outputs(getattr(torch, name), hq, split)).hexdigest()
    assert digest == DIGESTS[case]
