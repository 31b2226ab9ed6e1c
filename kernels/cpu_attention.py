"""The compiled CPU attention (``radixd_attend_rows``, cpu_attention.c): prefill and decode rows alike.

Each query row (a token: its block table and position) attends to keys ``0..pos`` (under a sliding
window ``W``: ``pos - W + 1..pos``, the splits wholly left of it skipped) in splits fixed by position;
``RowsPlan`` checks every index the C code follows (a plan serves every window: the window is the
call's). :func:`design` picks the design: ``RADIXD_CPU_ATTENTION`` = ``compiled`` | ``split`` |
``auto`` (default: compiled where the library builds, else split_attention.py's); prefill and decode
ask it alike, so a process never mixes the two.

NOTE: a row's arithmetic depends only on its query, its keys and its position: not on the other rows
of the call, the batch size, the thread count, or whether it is a prefill or a decode row.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from radixd.kernels.native import Attn, DType, library

ENV_DESIGN = "RADIXD_CPU_ATTENTION"
DESIGNS = ("auto", "compiled", "split")
_DTYPES = {torch.float32: DType.F32, torch.bfloat16: DType.BF16, torch.float16: DType.F16}
# Query / output dtypes the kernel reads and writes as they are (others go through float32).
_IO_DTYPES = {torch.float32: DType.F32, torch.bfloat16: DType.BF16}
_LANES = 8
_MAX_D = 256  # cpu_attention.c's MAX_D
# Below this many (key, kv head) visits per call a second thread costs more than it saves. Rows of at
# most one split (256 keys) cannot split.
_PARALLEL_MIN_WORK = 1024


def design() -> str:
    """The CPU attention design in force: "compiled" or "split" (see the module docstring)."""
    name = os.environ.get(ENV_DESIGN, "auto").strip().lower() or "auto"
    if name not in DESIGNS:
        raise ValueError(f"unknown {ENV_DESIGN}={name!r}: use one of {DESIGNS}")
    if name == "split":
        return "split"
    lib = library()
    if lib is None:
        if name == "compiled":
            raise RuntimeError(
                f"{ENV_DESIGN}=compiled but the CPU attention kernel did not build (see warning)"
            )
        return "split"
    return "compiled"


def supports(k_cache: torch.Tensor, group: int) -> bool:
    """Whether the compiled kernel takes these pools (a contiguous CPU pool of a handled dtype and head
    size); a pool it does not take goes to the split design in prefill and decode alike."""
    d = k_cache.shape[3]
    return (
        k_cache.device.type == "cpu"
        and k_cache.dtype in _DTYPES
        and d % _LANES == 0
        and d <= _MAX_D
        and group >= 1
        and k_cache.is_contiguous()
    )


def use_compiled(k_cache: torch.Tensor, group: int) -> bool:
    """Whether prefill and decode over ``k_cache`` run the compiled kernel (else the split design)."""
    return supports(k_cache, group) and design() == "compiled"


@dataclass(frozen=True)
class RowsPlan:
    """Validated rows of one call (or of every layer of a step: the tables are the same for all)."""

    tables: torch.Tensor  # int32 [num_tables, width], contiguous
    row_table: torch.Tensor  # int64 [R]: the table row each query row reads
    row_pos: torch.Tensor  # int64 [R]: the row's last key position (-1: no keys, a zero row)
    block_size: int
    num_blocks: int
    work: int  # keys visited per kv head, summed over the rows: sizes the thread count


def plan_rows(
    tables: torch.Tensor, row_table: torch.Tensor, row_pos: torch.Tensor, block_size: int, num_blocks: int
) -> RowsPlan:
    """Check that every index the kernel will follow stays inside the tables and the pool (ValueError).
    NOTE: the C code reads through these indices unchecked (out of range would read foreign memory), so
    this is the one gate in front of it."""
    tabs = tables.to(torch.int32).contiguous()
    rt = row_table.to(torch.int64).contiguous()
    rp = row_pos.to(torch.int64).clamp(min=-1).contiguous()
    r = rt.shape[0]
    if rp.shape[0] != r:
        raise ValueError(f"attention: {r} table rows for {rp.shape[0]} positions")
    max_pos = int(rp.max()) if r else -1
    if max_pos >= tabs.shape[1] * block_size:
        raise ValueError(
            f"attention: block_tables has {tabs.shape[1]} columns of {block_size}-token blocks but a row "
            f"reads position {max_pos}: the table must cover every position below seq_len"
        )
    if r and (int(rt.min()) < 0 or int(rt.max()) >= tabs.shape[0]):
        raise ValueError(f"attention: row_table entries must lie in [0, {tabs.shape[0]})")
    if tabs.numel() and (int(tabs.min()) < 0 or int(tabs.max()) >= num_blocks):
        raise ValueError(f"attention: block ids must lie in [0, {num_blocks})")
    return RowsPlan(tabs, rt, rp, block_size, num_blocks, int(rp.sum()) + r)


def query_lens(
    cu_q_lens: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu, seq_lens, q_lens) of a prefill call as int64 CPU tensors; ValueError unless every sequence
    has 0 <= q_len <= seq_len (its new tokens are in the KV)."""
    cu = cu_q_lens.long().cpu()
    lens = seq_lens.long().cpu()
    q_lens = cu[1:] - cu[:-1]
    if bool((q_lens > lens).any()) or bool((q_lens < 0).any()):
        raise ValueError(
            "paged_prefill: every sequence needs 0 <= q_len <= seq_len (new tokens are in the KV)"
        )
    return cu, lens, q_lens


def prefill_rows(
    cu_q_lens: torch.Tensor, seq_lens: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_table, row_pos) of a prefill call's `rows` query rows: new token j of sequence s is a row
    of table s at position seq_len - q_len + j, the very row a decode of that position runs; rows
    outside ``cu_q_lens`` attend to nothing (-1). Checked as `query_lens` checks."""
    cu, lens, q_lens = query_lens(cu_q_lens, seq_lens)
    seq = torch.repeat_interleave(torch.arange(q_lens.shape[0]), q_lens)
    tok = torch.arange(int(cu[0]), int(cu[-1])) if cu.numel() else torch.zeros(0, dtype=torch.int64)
    row_table = torch.zeros(rows, dtype=torch.int64)
    row_pos = torch.full((rows,), -1, dtype=torch.int64)
    row_table[tok] = seq
    row_pos[tok] = (lens - q_lens)[seq] + tok - cu[seq]
    return row_table, row_pos


def step_plan(
    prefill_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    prefill_lens: torch.Tensor,
    decode_tables: torch.Tensor,
    decode_lens: torch.Tensor,
    block_size: int,
    num_blocks: int,
) -> RowsPlan:
    """The rows of a whole step, prefill tokens first (`prefill_rows`), then one row per decode
    sequence at position seq_len - 1: one plan that every layer of the step attends along."""
    np_ = int(cu_q_lens[-1]) if cu_q_lens.numel() else 0
    pre_table, pre_pos = prefill_rows(cu_q_lens, prefill_lens, np_)
    dec_pos = decode_lens.long().cpu() - 1
    sp = prefill_tables.shape[0] if np_ else 0
    tables = step_tables(prefill_tables, np_, decode_tables)
    row_table = torch.cat((pre_table, sp + torch.arange(dec_pos.shape[0])))
    return plan_rows(tables, row_table, torch.cat((pre_pos, dec_pos)), block_size, num_blocks)


def step_tables(prefill_tables: torch.Tensor, num_prefill: int, decode_tables: torch.Tensor) -> torch.Tensor:
    """The tables of `step_plan`'s rows (unchecked), int32 on the CPU at one width: the prefill
    sequences' (where the step has `num_prefill` > 0 prefill tokens), then the decode rows'."""
    sp = prefill_tables.shape[0] if num_prefill else 0
    width = max(prefill_tables.shape[1] if sp else 1, decode_tables.shape[1] if decode_tables.shape[0] else 1)
    parts = [t.cpu().to(torch.int32) for t in ((prefill_tables[:sp],) if sp else ()) + (decode_tables,)]
    return torch.cat(
        [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in parts if t.numel()]
        or [torch.zeros(1, width, dtype=torch.int32)]
    )


def threads_for(plan: RowsPlan, hkv: int, window: int = 0) -> int:
    """Threads a call over ``plan`` takes: torch's count, or one where the work is too small to split
    (under a sliding ``window`` a row visits at most ``window`` keys)."""
    work = plan.work
    if window > 0 and plan.row_pos.numel():
        work = int(plan.row_pos.clamp(max=window - 1).sum()) + plan.row_pos.shape[0]
    return torch.get_num_threads() if work * hkv >= _PARALLEL_MIN_WORK else 1


def attend_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: RowsPlan,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """Attention of the query rows q [R, Hq, D] along ``plan`` (:func:`plan_rows`) over pools
    [N, B, Hkv, D] that :func:`supports`; ``window`` > 0: a row at ``pos`` sees keys ``pos - window +
    1..pos`` only. -> [R, Hq, D] in q's dtype (float32 and bfloat16 queries go in and come out as they
    are: no conversion beside a layer's call)."""
    lib = library()
    if lib is None:
        raise RuntimeError("the compiled CPU attention is not available")
    r, hq, d = q.shape
    n_blocks, b, hkv, _ = k_cache.shape
    if (b, n_blocks) != (plan.block_size, plan.num_blocks) or plan.row_pos.shape[0] != r:
        raise ValueError(
            f"attention: the rows were planned for {plan.row_pos.shape[0]} rows over {plan.num_blocks} "
            f"blocks of {plan.block_size} tokens, called with {r} rows over {n_blocks} blocks of {b}"
        )
    if v_cache.shape != k_cache.shape or not v_cache.is_contiguous() or v_cache.dtype != k_cache.dtype:
        raise ValueError("attention: v_cache must be a contiguous pool shaped and typed like k_cache")
    io = _IO_DTYPES.get(q.dtype)
    qx = q.contiguous() if io is not None else q.to(torch.float32).contiguous()
    out = torch.empty(r, hq, d, dtype=qx.dtype)
    if r == 0:
        return out.to(q.dtype)
    call = Attn(
        q=qx.data_ptr(),
        out=out.data_ptr(),
        k=k_cache.data_ptr(),
        v=v_cache.data_ptr(),
        tables=plan.tables.data_ptr(),
        row_table=plan.row_table.data_ptr(),
        row_pos=plan.row_pos.data_ptr(),
        rows=r,
        block_size=b,
        hkv=hkv,
        group=hq // hkv,
        d=d,
        width=plan.tables.shape[1],
        window=window,
        scale=scale,
        io_dtype=_IO_DTYPES[qx.dtype],
        dtype=_DTYPES[k_cache.dtype],
    )
    rc = lib.radixd_attend_rows(ctypes.byref(call), threads_for(plan, hkv, window))
    if rc != 0:
        raise MemoryError("attention: the CPU kernel could not allocate its buffers")
    return out if io is not None else out.to(q.dtype)
