"""CPU benchmark of the paged decode attention: both designs, SDPA, and the memory floor; with
``--gemm``, of the 8-bit-activation projection kinds instead.

Decode batch of ``--batch`` sequences at SmolLM2-135M's attention shape (9 query heads, 3 kv heads,
head_dim 64), 16-token blocks scattered over the pool, for each context of ``--ctx`` (a comma list).
With ``--layers L`` every variant attends over L distinct pools per round (one per layer, as a decode
step does), so K/V come from memory rather than the caches; the figure is per step (all L layers).
The pools are the daemon's: as large as its default KV budget (``--pool-gib``; or the context, if
larger), in 2 MiB pages where the OS lends them, as its ModelRunner allocates them.

Variants, timed interleaved (one call of each per round, after two warm-up rounds):
- ``compiled``: the compiled row kernel (kernels/cpu_attention.c, the default design);
- ``split``: the torch split design (kernels/split_attention.py, the fallback without a compiler);
- ``SDPA``: ``F.scaled_dot_product_attention`` on a contiguous copy of the same K/V (``--sdpa``).

Each variant's call follows one full read of a 256 MiB tensor (``--read-mib``; ``sum``, in 2 MiB
pages) at the same thread count, timed: the machine's read bandwidth (a round's median). The floor
is the K/V bytes the step reads / that bandwidth; ``x floor`` is the median over rounds of (variant
time / floor of the same round).

    .venv/bin/python bench/kernels_cpu.py --ctx 128,1000,4000,16000 --layers 30 --threads 1

``--gemm 2048x2048,8192x2048`` (n x k, outputs x inputs) times ``radixd_gemm`` over the GGUF blocks of
each kind of :data:`GEMM_KINDS` (random codes, fp16 scales) for ``--gemm-rows`` rows, the kinds
interleaved, each call on a copy of the weights after the previous call's (copies enough for 64 MiB:
the weights come from memory, as in a decode step); median ms per call (wall, and the calling thread's
CPU time: on a shared machine the wall time also counts the time the kernel waited for a core), GB/s
of weights at one row (wall), GMAC/s a thread (multiply-accumulates / threads / the calling thread's
CPU time, its share of the work: what a shared machine's waits leave out of the wall time), and each
kind's speed against Q4_1_A8's and, for a repacked kind (``q4_k_x16``, ``q5_k_x16``, ``q6_k_x16``:
kernels/kquant_x16.c; ``q4_1_x16``, ``q8_0_x16``, ``q5_0_x16``, ``q4_0_x16``, ``q5_1_x16``:
kernels/legacy_x16.c), against the stored kind it repacks (median of per-round ratios);
``--gemm-kinds`` picks kinds; ``--gemm-cached`` keeps one copy of the weights (in cache: the kernels'
compute alone):

    .venv/bin/python bench/kernels_cpu.py --gemm 2048x2048,8192x2048,2048x640 --threads 2
    .venv/bin/python bench/kernels_cpu.py --gemm 2048x2048,8192x2048,2048x8192 --threads 1 \
        --gemm-kinds q4_1_a8,q4_k_a8,q4_k_x16,q6_k_a8,q6_k_x16
    .venv/bin/python bench/kernels_cpu.py --gemm 1536x576,576x1536,576x576,49152x576 --threads 1 \
        --gemm-kinds q4_1_a8,q4_1_x16,q8_0_a8,q8_0_x16 --gemm-cached --rounds 15
    .venv/bin/python bench/kernels_cpu.py --gemm 2048x2048 --gemm-rows 1,8,64 --threads 1 \
        --gemm-kinds q4_0_a8,q4_0_x16,q5_1_a8,q5_1_x16 --gemm-cached --rounds 15
    .venv/bin/python bench/kernels_cpu.py --gemm 2048x2048 --gemm-rows 1,8,64 --threads 1 \
        --gemm-kinds q4_k_a8,q4_k_x16,q5_k_a8,q5_k_x16 --gemm-cached --rounds 15

``--peak`` compiles and runs :data:`PEAK_C` (needs a C compiler and AVX512-VNNI): one core's int8
multiply-accumulate peak, `vpdpbusd` on 12 independent accumulators so that throughput, not latency,
bounds it, and the same with a `vpmulld` + `vpaddd` per 8 of them (kernels/kquant_x16.c's mix for the
K-quants' exact sub-block scales): the limit the projection kinds' GMAC/s compare with.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from benchkit import BLOCKS, DEFAULT_KV_CACHE_GB, Gemm, repack_x16, zeros_on_huge_pages

from radixd.kernels import cpu_attention
from radixd.kernels.paged_decode import paged_decode_torch, plan_for, rows_plan_for
from radixd.kernels.paged_prefill import paged_prefill_torch
from radixd.kernels.paging import gather_kv

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HQ, HKV, D, B = 9, 3, 64, 16


def read_bandwidth_fn(mib: int = 256) -> tuple[Callable[[], object], int]:
    buf = zeros_on_huge_pages((mib << 18,), torch.float32).fill_(1.0)
    return (lambda: buf.sum()), buf.numel() * 4


def query_dtype(pool: torch.dtype) -> torch.dtype:
    """The query's dtype beside a pool of `pool`: that of the activations of the modes that keep such a
    pool (bfloat16 beside bfloat16: int4, bfloat16; float32 beside float32 and f16: float32, w4a8)."""
    return torch.bfloat16 if pool == torch.bfloat16 else torch.float32


def tolerance(pool: torch.dtype) -> float:
    """How far the variants' answers may lie from the split design's over a pool of `pool`."""
    return 1e-4 if pool == torch.float32 else 3e-2


def build(
    batch: int,
    ctx: int,
    layers: int,
    dtype: torch.dtype,
    ragged: bool,
    sdpa: bool,
    in_order: bool = False,
    pool_gib: float = DEFAULT_KV_CACHE_GB,
) -> dict[str, object]:
    """``layers`` pools sharing one block table (blocks scattered at random over the pool, or with
    ``in_order`` consecutive ids from 1: what one conversation takes from a fresh pool, whose free
    blocks are handed out in runs), queries, lengths and, with ``sdpa``, contiguous [S, Hkv, L, D]
    copies of each layer's K/V."""
    g = torch.Generator().manual_seed(ctx)
    lens = torch.randint(ctx // 2, ctx + 1, (batch,), generator=g) if ragged else torch.full((batch,), ctx)
    nb = -(-ctx // B)
    budget = int(pool_gib * (1 << 30)) // (2 * layers * B * HKV * D * dtype.itemsize)
    n = max(batch * nb + 1, budget)
    chosen = (
        torch.arange(1, batch * nb + 1) if in_order else torch.randperm(n - 1, generator=g)[: batch * nb] + 1
    )
    tables = chosen.view(batch, nb).to(torch.int32)
    pools = []
    for _ in range(layers):
        k, v = zeros_on_huge_pages((n, B, HKV, D), dtype), zeros_on_huge_pages((n, B, HKV, D), dtype)
        k[chosen], v[chosen] = (torch.randn(2, batch * nb, B, HKV, D, generator=g).to(dtype)).unbind(0)
        pools.append((k, v))
    cont = []
    if sdpa:
        for k, v in pools:
            cont.append(
                (
                    gather_kv(k, tables, nb).transpose(1, 2).contiguous(),
                    gather_kv(v, tables, nb).transpose(1, 2).contiguous(),
                )
            )
    q = torch.randn(batch, HQ, D, generator=g).to(query_dtype(dtype))
    return {"q": q, "pools": pools, "cont": cont, "tables": tables, "lens": lens.to(torch.int32)}


def variants(t: dict[str, object], sdpa: bool) -> dict[str, Callable[[], object]]:
    q, tables, lens = t["q"], t["tables"], t["lens"]
    pools, cont = t["pools"], t["cont"]
    assert isinstance(q, torch.Tensor) and isinstance(tables, torch.Tensor) and isinstance(lens, torch.Tensor)
    assert isinstance(pools, list) and isinstance(cont, list)
    scale = 1.0 / math.sqrt(D)
    k0 = pools[0][0]
    # Plans are made once per step in the model; here once per benchmark (the same for every layer).
    rows_plan = rows_plan_for(tables, lens, k0)
    split_plan = plan_for(tables, lens, k0)

    def with_design(name: str, plan: object) -> Callable[[], object]:
        def run() -> object:
            os.environ[cpu_attention.ENV_DESIGN] = name
            return [paged_decode_torch(q, k, v, tables, lens, scale, plan) for k, v in pools]  # type: ignore[arg-type]

        return run

    fns = {"compiled": with_design("compiled", rows_plan), "split": with_design("split", split_plan)}
    if sdpa:
        s = q.shape[0]
        length = cont[0][0].shape[2]
        mask = (torch.arange(length)[None, :] < lens[:, None].long()).view(s, 1, 1, length)
        m = None if bool(mask.all()) else mask
        q4 = q.view(s, HQ, 1, D).to(cont[0][0].dtype)
        fns["SDPA (contiguous)"] = lambda: [
            F.scaled_dot_product_attention(q4, kc, vc, attn_mask=m, scale=scale, enable_gqa=True)
            for kc, vc in cont
        ]
    # Same data, same answer (to rounding) before anything is timed.
    want = fns["split"]()
    for name, fn in fns.items():
        for got, ref in zip(fn(), want, strict=True):  # type: ignore[call-overload]
            atol = tolerance(pools[0][0].dtype)
            torch.testing.assert_close(
                got.reshape(ref.shape).float(), ref.float(), atol=atol, rtol=atol, msg=name
            )
    return fns


def prefill_variants(t: dict[str, object]) -> dict[str, Callable[[], object]]:
    """Every sequence's whole context as one prefill chunk (``--prefill``): each variant's prefill twin."""
    tables, lens, pools = t["tables"], t["lens"], t["pools"]
    assert isinstance(tables, torch.Tensor) and isinstance(lens, torch.Tensor) and isinstance(pools, list)
    total = int(lens.sum())
    q = torch.randn(total, HQ, D, generator=torch.Generator().manual_seed(1)).to(
        query_dtype(pools[0][0].dtype)
    )
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), lens.long().cumsum(0))).to(torch.int32)
    scale = 1.0 / math.sqrt(D)

    def with_design(name: str) -> Callable[[], object]:
        def run() -> object:
            os.environ[cpu_attention.ENV_DESIGN] = name
            return [paged_prefill_torch(q, k, v, tables, cu, lens, scale) for k, v in pools]

        return run

    fns = {"compiled": with_design("compiled"), "split": with_design("split")}
    want = fns["split"]()
    for name, fn in fns.items():
        for got, ref in zip(fn(), want, strict=True):  # type: ignore[call-overload]
            atol = tolerance(pools[0][0].dtype)
            torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=atol, msg=name)
    return fns


def measure(fns: dict[str, Callable[[], object]], rounds: int, read_mib: int) -> dict[str, list[float]]:
    """Seconds per call of each variant, one of each per round, and of the bandwidth read (the round's
    median). Every variant follows a bandwidth read of its own, so each starts with the caches as
    cold as the last (the one that ran first in a round used to pay alone for the Python and torch
    code the read evicted: 0.82 against 0.58 ms at 128 tokens for the same kernel)."""
    bw_fn, _ = read_bandwidth_fn(read_mib)
    times: dict[str, list[float]] = {name: [] for name in ("(bandwidth read)", *fns)}
    for r in range(rounds + 2):
        reads = []
        for name, fn in fns.items():
            t0 = time.perf_counter()
            bw_fn()
            t1 = time.perf_counter()
            fn()
            t2 = time.perf_counter()
            reads.append(t1 - t0)
            if r >= 2:
                times[name].append(t2 - t1)
        if r >= 2:
            times["(bandwidth read)"].append(statistics.median(reads))
    return times


# The kinds --gemm times (Q4_1_A8, the reference, first; its codes, scales and minimums are separate
# arrays, the others' blocks are as the file stores them: (weights, bytes) a block in `BLOCKS`).
GEMM_KINDS = (
    *("q4_1_a8", "q8_0_a8", "q4_0_a8", "q5_0_a8", "q5_1_a8", "q4_k_a8", "q5_k_a8", "q6_k_a8"),
    *("q4_1_x16", "q8_0_x16", "q5_0_x16", "q4_0_x16", "q5_1_x16", "q4_k_x16", "q5_k_x16", "q6_k_x16"),
)
# A repacked kind -> the stored kind whose blocks it repacks.
REPACKED = {
    "q4_k_x16": "q4_k_a8",
    "q5_k_x16": "q5_k_a8",
    "q6_k_x16": "q6_k_a8",
    "q4_1_x16": "q4_1_a8",
    "q8_0_x16": "q8_0_a8",
    "q5_0_x16": "q5_0_a8",
    "q4_0_x16": "q4_0_a8",
    "q5_1_x16": "q5_1_a8",
}
# Where a block's fp16 scales lie (scale, then the minimums' scale where it has one; the repacked
# K-quants' "_raw" blocks too: random bytes there would be any fp16, infinities and NaNs included).
SCALES_AT = {
    **{c: (0, 4) for c in ("q4_1_raw", "q5_1_raw", "q5_1_a8", "q4_k_a8", "q5_k_a8", "q4_k_raw", "q5_k_raw")},
    **{c: (208, 210) for c in ("q6_k_a8", "q6_k_raw")},
}


def gemm_operands(coding: str, n: int, k: int, g: torch.Generator) -> list[torch.Tensor]:
    """Random codes with small fp16 scales (and negative minimums) in the kind's layout."""
    if coding in REPACKED:
        (raw,) = gemm_operands(f"{coding[:4]}_raw", n, k, g)
        packed = repack_x16(coding[:4].upper(), raw, n, k)
        if packed is None:
            raise SystemExit(f"{coding} needs a CPU with AVX512-VNNI and outputs a multiple of 16")
        return [packed]

    def halves(per: int = 32) -> torch.Tensor:
        return (torch.rand(n, k // per, generator=g) * 1e-2 + 1e-4).half()

    if coding == "q4_1_a8":
        return [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g), halves(), -halves()]
    if coding == "q8_0_a8":
        return [torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g), halves()]
    # "q4_1_raw", "q8_0_raw": the file's blocks, which the split kinds above hold reordered
    per, size = BLOCKS[coding.removesuffix("_a8").removesuffix("_raw").upper()]
    raw = torch.randint(0, 256, (n, k // per, size), dtype=torch.uint8, generator=g)
    start, end = SCALES_AT.get(coding, (0, 2))
    for at in range(start, end, 2):
        raw[..., at : at + 2] = halves(per).view(torch.uint8).view(n, k // per, 2)
    return [raw.view(n, -1)]


def gemm_report(
    shapes: str, rows: str, rounds: int, kinds: tuple[str, ...] = GEMM_KINDS, cached: bool = False
) -> str:
    """The --gemm table (see the module's docstring); `cached`: one copy of the weights, called as often."""
    threads = torch.get_num_threads()
    lines = [
        f"radixd_gemm, {threads} threads, {rounds} interleaved rounds; weights "
        + ("in cache (one copy)" if cached else "from memory"),
        "",
        "| n x k | rows | kind | MiB | median ms | CPU ms | GB/s | GMAC/s a thread | vs q4_1_a8 "
        "| vs stored |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    g = torch.Generator().manual_seed(0)
    kinds = ("q4_1_a8", *(c for c in kinds if c != "q4_1_a8"))
    for shape in shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        copies: dict[str, list[Gemm]] = {}
        for c in kinds:
            one = sum(t.numel() * t.element_size() for t in gemm_operands(c, n, k, g))
            count = -(-(64 << 20) // one)
            made = [Gemm(c, gemm_operands(c, n, k, g), None, (n, k)) for _ in range(1 if cached else count)]
            copies[c] = made * count if cached else made
        for m in (int(v) for v in rows.split(",")):
            x = torch.randn(m, k, generator=g)
            times: dict[str, list[float]] = {c: [] for c in kinds}
            cpu: dict[str, list[float]] = {c: [] for c in kinds}
            for r in range(rounds + 1):
                for c, gemms in copies.items():
                    t0, c0 = time.perf_counter(), time.thread_time()
                    for gm in gemms:
                        gm(x)
                    if r:
                        times[c].append((time.perf_counter() - t0) / len(gemms))
                        cpu[c].append((time.thread_time() - c0) / len(gemms))
            for c, ts in times.items():
                mib = sum(t.numel() * t.element_size() for t in copies[c][0].operands) / 2**20
                med, med_cpu = statistics.median(ts), statistics.median(cpu[c])
                gbs = f"{mib * 2**20 / med / 1e9:.1f}" if m == 1 else ""
                vs = statistics.median(a / b for a, b in zip(times["q4_1_a8"], ts, strict=True))
                base = times.get(REPACKED.get(c, ""))
                vs_stored = (
                    f"{statistics.median(a / b for a, b in zip(base, ts, strict=True)):.2f}x" if base else ""
                )
                ms = f"{med * 1e3:.3f} | {med_cpu * 1e3:.3f}"
                gmac = f"{n * k * m / threads / med_cpu / 1e9:.1f}"
                lines.append(
                    f"| {n}x{k} | {m} | {c} | {mib:.2f} | {ms} | {gbs} | {gmac} | {vs:.2f}x | {vs_stored} |"
                )
            print("\n".join(lines[-len(times) :]), flush=True)
    return "\n".join(lines)


PEAK_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define STEPS 200000000LL

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: a shared core's waits left out */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    __m512i acc[12], sum[4];
    __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(5);
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
    double t0 = now();
    for (long long it = 0; it < STEPS / 12; it++) {
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], u, v);
        __asm__ volatile("" : "+v"(u)); /* u is unknown to the compiler each round */
    }
    double s = now() - t0;
    printf("vpdpbusd zmm: %.2f G instructions/s = %.1f GMAC/s\n", STEPS / s / 1e9, STEPS * 64.0 / s / 1e9);

    for (int i = 0; i < 4; i++) sum[i] = _mm512_setzero_si512();
    t0 = now();
    for (long long it = 0; it < STEPS / 64; it++) {
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 8; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], u, v);
        for (int i = 0; i < 8; i++) sum[i & 3] = _mm512_add_epi32(sum[i & 3], _mm512_mullo_epi32(acc[i], u));
        __asm__ volatile("" : "+v"(u));
    }
    s = now() - t0;
    __m512i all = _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]), _mm512_add_epi32(sum[2], sum[3]));
    for (int i = 0; i < 12; i++) all = _mm512_add_epi32(all, acc[i]);
    const double macs = (double)(STEPS / 64) * 64 * 64;
    printf("8 vpdpbusd + vpmulld + vpaddd (zmm): %.1f GMAC/s (check %d)\n", macs / s / 1e9,
           _mm512_reduce_add_epi32(all));
    return 0;
}
"""


def peak_report() -> str:
    """--peak: PEAK_C built with -O3 -march=native and run; its two lines."""
    cc = shutil.which(os.environ.get("CC", "")) or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("--peak needs a C compiler (cc, gcc or $CC)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(src, "w") as f:
            f.write(PEAK_C)
        subprocess.run([cc, "-O3", "-funroll-all-loops", "-march=native", src, "-o", exe], check=True)
        return subprocess.run([exe], check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx", default="128,1000,4000,16000", help="context lengths, comma-separated")
    ap.add_argument("--layers", type=int, default=30, help="distinct pools per round (SmolLM2: 30 layers)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument(
        "--ragged", action="store_true", help="lengths uniform in [ctx/2, ctx] instead of all ctx"
    )
    ap.add_argument(
        "--in-order",
        action="store_true",
        help="blocks in consecutive ids (one conversation on a fresh pool) instead of scattered at random",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--pool-gib", type=float, default=DEFAULT_KV_CACHE_GB, help="K and V pools in all")
    ap.add_argument("--read-mib", type=int, default=256, help="the bandwidth read's buffer")
    ap.add_argument("--sdpa", action="store_true", help="also time SDPA on contiguous copies")
    ap.add_argument(
        "--prefill", action="store_true", help="time the prefill twins instead: each context as one chunk"
    )
    ap.add_argument("--gemm", default="", help="time the projection kinds instead, at these n x k shapes")
    ap.add_argument("--gemm-rows", default="1,8,64", help="--gemm's row counts, comma-separated")
    ap.add_argument("--gemm-kinds", default=",".join(GEMM_KINDS), help="--gemm's kinds, comma-separated")
    ap.add_argument(
        "--gemm-cached",
        action="store_true",
        help="--gemm: one copy of the weights (in cache: the compute alone)",
    )
    ap.add_argument("--peak", action="store_true", help="measure one core's vpdpbusd peak instead")
    args = ap.parse_args(argv)
    if args.peak:
        report = peak_report()
        print(report)
        return report
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gemm:
        kinds = tuple(args.gemm_kinds.split(","))
        unknown = set(kinds) - set(GEMM_KINDS)
        if unknown:
            ap.error(f"unknown --gemm-kinds {sorted(unknown)} (known: {', '.join(GEMM_KINDS)})")
        report = gemm_report(args.gemm, args.gemm_rows, args.rounds, kinds, args.gemm_cached)
        print()
        print(report)
        return report
    dtype = DTYPES[args.dtype]
    bw_bytes = args.read_mib << 20
    lines = [
        f"{'prefill' if args.prefill else 'decode'} batch {args.batch}"
        f"{' (ragged, ctx/2..ctx)' if args.ragged else ''}"
        f"{', blocks in consecutive ids' if args.in_order else ', blocks scattered over the pool'}, "
        f"{args.layers} layers' pools per round, Hq={HQ} Hkv={HKV} D={D} block={B}, {args.dtype}, "
        f"{torch.get_num_threads()} threads, "
        f"{args.rounds} interleaved rounds; ms per step (all layers)",
        "",
        "| ctx | K+V MiB/step | read GB/s | floor ms | variant | median ms | x floor | vs split |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for ctx in [int(c) for c in args.ctx.split(",")]:
        t = build(
            args.batch,
            ctx,
            args.layers,
            dtype,
            args.ragged,
            args.sdpa and not args.prefill,
            args.in_order,
            args.pool_gib,
        )
        fns = prefill_variants(t) if args.prefill else variants(t, args.sdpa)
        times = measure(fns, args.rounds, args.read_mib)
        lens = t["lens"]
        assert isinstance(lens, torch.Tensor)
        kv_bytes = args.layers * 2 * int(lens.sum()) * HKV * D * dtype.itemsize
        bws = [bw_bytes / x for x in times["(bandwidth read)"]]
        floors = [kv_bytes / bw for bw in bws]
        for name in fns:
            ts = times[name]
            x_floor = statistics.median(a / f for a, f in zip(ts, floors, strict=True))
            vs_split = statistics.median(b_ / a for a, b_ in zip(ts, times["split"], strict=True))
            lines.append(
                f"| {ctx} | {kv_bytes / 2**20:.1f} | {statistics.median(bws) / 1e9:.1f} | "
                f"{statistics.median(floors) * 1e3:.2f} | {name} | {statistics.median(ts) * 1e3:.2f} | "
                f"{x_floor:.2f} | {vs_split:.2f}x |"
            )
        print("\n".join(lines[-len(fns) :]), flush=True)
    report = "\n".join(lines)
    print()
    print(report)
    return report


if __name__ == "__main__":
    main()
