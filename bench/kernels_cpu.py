"""CPU benchmark of the paged_decode torch twin against plain SDPA on a contiguous cache.

Decode batch of 32 sequences x 1,024 tokens at SmolLM2-135M's attention shape (9 query heads,
3 kv heads, head_dim 64) with 16-token blocks scattered over the pool. Variants are timed
interleaved (one call of each per round) so that load from other processes hits all alike;
medians are reported side by side from one run.

    .venv/bin/python bench/kernels_cpu.py [--batch 32] [--ctx 1024] [--rounds 40] [--ragged] [--threads N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixd.kernels.paged_decode import paged_decode_torch
from radixd.kernels.paging import gather_kv

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build(
    batch: int, ctx: int, hq: int, hkv: int, d: int, b: int, dtype: torch.dtype, ragged: bool, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A pool with every sequence's blocks scattered at random, plus the same K/V laid out contiguously."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(ctx // 2, ctx + 1, (batch,), generator=g) if ragged else torch.full((batch,), ctx)
    nb = -(-ctx // b)
    n = batch * nb + 1
    k = torch.randn(n, b, hkv, d, generator=g).to(dtype)
    v = torch.randn(n, b, hkv, d, generator=g).to(dtype)
    tables = (torch.randperm(n - 1, generator=g)[: batch * nb] + 1).view(batch, nb).to(torch.int32)
    q = torch.randn(batch, hq, d, generator=g).to(dtype)
    # The contiguous baseline holds exactly the same data: [S, Hkv, L, D].
    k_cont = gather_kv(k, tables, nb).transpose(1, 2).contiguous()
    v_cont = gather_kv(v, tables, nb).transpose(1, 2).contiguous()
    return {
        "q": q,
        "k": k,
        "v": v,
        "tables": tables,
        "lens": lens.to(torch.int32),
        "kc": k_cont,
        "vc": v_cont,
    }


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call for each variant, one call of each per round (after two warm-up rounds)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds + 2):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= 2:
                times[name].append(dt)
    return times


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument(
        "--ragged", action="store_true", help="lengths uniform in [ctx/2, ctx] instead of all ctx"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    hq, hkv, d, b = 9, 3, 64, 16
    dtype = DTYPES[args.dtype]
    t = build(args.batch, args.ctx, hq, hkv, d, b, dtype, args.ragged)
    scale = 1.0 / math.sqrt(d)
    s, length = args.batch, t["kc"].shape[2]
    mask = (torch.arange(length)[None, :] < t["lens"][:, None].long()).view(s, 1, 1, length)
    full = bool(mask.all())

    def twin() -> torch.Tensor:
        return paged_decode_torch(t["q"], t["k"], t["v"], t["tables"], t["lens"], scale)

    def sdpa() -> torch.Tensor:
        q4 = t["q"].view(s, hq, 1, d)
        m = None if full else mask
        return F.scaled_dot_product_attention(q4, t["kc"], t["vc"], attn_mask=m, scale=scale, enable_gqa=True)

    want = sdpa().view(s, hq, d).float()
    got = twin().float()
    atol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, atol=atol, rtol=atol)  # same data, same answer

    times = time_interleaved({"torch twin (paged)": twin, "SDPA (contiguous)": sdpa}, args.rounds)
    base = statistics.median(times["SDPA (contiguous)"])
    kv_bytes = 2 * int(t["lens"].sum()) * hkv * d * t["k"].element_size()
    lines = [
        f"decode: batch {s} x ctx {args.ctx}{' (ragged, ctx/2..ctx)' if args.ragged else ''}, "
        f"Hq={hq} Hkv={hkv} D={d} block={b}, {args.dtype}, {torch.get_num_threads()} threads, "
        f"{args.rounds} interleaved rounds, K+V read {kv_bytes / 2**20:.1f} MiB",
        "",
        "| variant | median ms | p10 ms | p90 ms | vs SDPA | GB/s (K+V) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, ts in times.items():
        qs = statistics.quantiles(ts, n=10)
        med = statistics.median(ts)
        lines.append(
            f"| {name} | {med * 1e3:.2f} | {qs[0] * 1e3:.2f} | {qs[-1] * 1e3:.2f} | "
            f"{med / base:.2f}x | {kv_bytes / med / 1e9:.1f} |"
        )
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
