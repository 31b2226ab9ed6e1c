"""A/B of builds of the CPU attention kernel (kernels/cpu_attention.c) from git revisions, interleaved.

Each revision's source is compiled with kernels/cpu_attention.py's flags into a temporary library;
every round calls each library once over the same pools, through the kernel's own entry point,
`radixd_attend_rows`, as the product calls it. The pools are the product's: ``--layers`` K and V
pools of SmolLM2-135M's attention shape holding ``--pool-gib`` in all (the daemon's default KV
budget), allocated as the daemon's ModelRunner allocates them (2 MiB pages where the OS lends them;
``--pages huge,4k`` adds the same pools in plain 4 KiB pages), the context's ``--ctx`` tokens in
blocks scattered over them. Reports the median ms per step (all layers) of each build, and the
median of its per-round ratios to the floor: the step's K+V bytes over the rate of a read of a
256 MiB tensor (in 2 MiB pages, the machine's best) at the same thread count (one before each
build's step, the round's median). A revision's results are the same kernel the product ran at
that commit; it is the call the compiled decoder step (kernels/cpu_decoder.c, `w4a8` and
`float32`) makes for each layer. ``--prefill N`` times a prefill chunk instead: the context's last
N positions as N rows of one call.

    .venv/bin/python -P bench/attention_builds.py --revs 0871567,1b20e3e --ctx 4000 --dtype fp16 --threads 1
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixd.daemon.engine.config import DEFAULT_KV_CACHE_GB
from radixd.daemon.process.host import zeros_on_huge_pages
from radixd.kernels.cpu_attention import _CFLAGS, _DTYPES, _IO_DTYPES
from radixd.kernels.native import _compiler, _omp_runtime

ROOT = Path(__file__).resolve().parent.parent
HQ, HKV, D, B = 9, 3, 64, 16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build(rev: str, out: Path) -> Callable[..., int]:
    """The kernel at git revision `rev` ("." for the working tree, a path ending in .c for that file: a
    variant under test), compiled into `out`: its entry point, called with today's arguments (a float32
    query and output: revisions before the query's dtype became an argument take them without it)."""
    path = ROOT / "kernels" / "cpu_attention.c"
    if rev == ".":
        src = path.read_bytes()
    elif rev.endswith(".c"):
        src = Path(rev).read_bytes()
    else:
        src = subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:kernels/cpu_attention.c"])
    c = out.with_suffix(".c")
    c.write_bytes(src)
    cc, omp = _compiler(), _omp_runtime()
    if cc is None:
        raise SystemExit("no C compiler")
    subprocess.run(
        [cc, *_CFLAGS, "-fPIC", "-shared", str(c), "-o", str(out), *([omp] if omp else [])], check=True
    )
    lib = ctypes.CDLL(str(out))
    i64, p = ctypes.c_int64, ctypes.c_void_p
    takes_io = b"int io_dtype" in src
    lib.radixd_attend_rows.argtypes = [
        p,
        *([ctypes.c_int] if takes_io else []),
        p,
        p,
        ctypes.c_int,
        i64,
        i64,
        i64,
        i64,
        p,
        i64,
        p,
        p,
        i64,
        ctypes.c_float,
        p,
        ctypes.c_int,
    ]
    lib.radixd_attend_rows.restype = ctypes.c_int
    fn = lib.radixd_attend_rows

    def attend(q: int, *rest: object) -> int:
        return int(fn(q, _IO_DTYPES[torch.float32], *rest) if takes_io else fn(q, *rest))

    return attend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--revs",
        required=True,
        help="git revisions, comma-separated ('.' = the working tree; a path ending in .c = that file)",
    )
    ap.add_argument("--ctx", type=int, default=4000)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="instead of one decode row, a prefill chunk: the context's last N positions as N rows",
    )
    ap.add_argument(
        "--in-order", action="store_true", help="blocks in table order instead of scattered over the pool"
    )
    ap.add_argument(
        "--hot",
        action="store_true",
        help="the step run twice, the second timed: with pools that fit in cache (--layers 1 --ctx 1000), "
        "the arithmetic alone",
    )
    ap.add_argument("--pool-gib", type=float, default=DEFAULT_KV_CACHE_GB, help="K and V pools in all")
    ap.add_argument(
        "--pages",
        default="huge",
        help="pools' pages, comma-separated: huge (the daemon's allocation) and/or 4k (torch.zeros)",
    )
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    g = torch.Generator().manual_seed(0)
    nb = -(-args.ctx // B)
    per_block = 2 * args.layers * B * HKV * D * dtype.itemsize
    n_pool = max(nb + 1, int(args.pool_gib * (1 << 30)) // per_block)
    # the context's blocks: scattered over the pool (block 0 is the daemon's null block)
    chosen = torch.arange(1, nb + 1) if args.in_order else torch.randperm(n_pool - 1, generator=g)[:nb] + 1
    tables = chosen.to(torch.int32)[None].contiguous()
    rand = [torch.randn(2, nb, B, HKV, D, generator=g).to(dtype) for _ in range(args.layers)]
    filled = [(kv[0], kv[1]) for kv in rand]

    def pools_in(pages: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        alloc = zeros_on_huge_pages if pages == "huge" else lambda shape, dt: torch.zeros(shape, dtype=dt)
        out = []
        for k_rows, v_rows in filled:
            k, v = alloc((n_pool, B, HKV, D), dtype), alloc((n_pool, B, HKV, D), dtype)
            k[chosen], v[chosen] = k_rows, v_rows
            out.append((k, v))
        return out

    page_kinds = args.pages.split(",")
    if not set(page_kinds) <= {"huge", "4k"}:
        raise SystemExit(f"--pages takes huge and/or 4k, got {args.pages!r}")
    pools_of = {pages: pools_in(pages) for pages in page_kinds}
    rows = args.prefill or 1
    row_table, row_pos = torch.zeros(rows, dtype=torch.int64), torch.arange(args.ctx - rows, args.ctx)
    q, out = torch.randn(rows, HQ, D, generator=g), torch.empty(rows, HQ, D)
    revs = args.revs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        libs = [build(rev, Path(tmp) / f"k{i}.so") for i, rev in enumerate(revs)]
        # a variant: a build over the pools in one kind of pages
        variants = [(f"{rev} {pages}" if len(page_kinds) > 1 else rev, lib, pools_of[pages])
                    for rev, lib in zip(revs, libs, strict=True) for pages in page_kinds]  # fmt: skip

        def step(attend: Callable[..., int], pools: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
            t0 = time.perf_counter()
            for k, v in pools:
                rc = attend(
                    q.data_ptr(), k.data_ptr(), v.data_ptr(), _DTYPES[dtype], B, HKV, HQ // HKV, D,
                    tables.data_ptr(), tables.shape[1], row_table.data_ptr(), row_pos.data_ptr(), rows,
                    ctypes.c_float(D**-0.5), out.data_ptr(), args.threads,
                )  # fmt: skip
                if rc:
                    raise MemoryError("the kernel could not allocate its buffers")
            return time.perf_counter() - t0

        # The floor: the step's K+V bytes over the rate of a read of a 256 MiB tensor in 2 MiB pages
        # at the same thread count (a round's median).
        torch.set_num_threads(args.threads)
        big = zeros_on_huge_pages((64 << 20,), torch.float32).fill_(1.0)
        kv_bytes = 2 * args.layers * args.ctx * HKV * D * dtype.itemsize

        def read() -> float:
            t0 = time.perf_counter()
            big.sum()
            return time.perf_counter() - t0

        times: list[list[float]] = [[] for _ in variants]
        floors: list[float] = []
        for _ in range(2):  # warm-up
            for _, lib, pools in variants:
                step(lib, pools)
        for _ in range(args.rounds):
            # a read before every variant's step, so that each starts from caches as cold as the others'
            reads = []
            for i, (_, lib, pools) in enumerate(variants):
                reads.append(read())
                if args.hot:
                    step(lib, pools)
                times[i].append(step(lib, pools))
            floors.append(kv_bytes * statistics.median(reads) / big.nbytes)
    shape = f"{args.ctx} tokens, {args.layers} layers, {args.dtype}, {args.threads} threads"
    floor_ms = statistics.median(floors) * 1e3
    what = f"prefill chunk of {rows} rows" if args.prefill else "batch 1"
    what += ", blocks in table order" if args.in_order else ""
    what += ", pools hot (the step run twice, the second timed)" if args.hot else ""
    print(f"{what}, {shape}, {args.rounds} rounds; floor (K+V read once) {floor_ms:.3f} ms")
    for (name, _, _), t in zip(variants, times, strict=True):
        x = statistics.median(a / f for a, f in zip(t, floors, strict=True))
        print(f"  {name}: median {statistics.median(t) * 1e3:.3f} ms a step, {x:.2f}x the floor")


if __name__ == "__main__":
    main()
