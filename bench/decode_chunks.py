"""How big should the CPU decode twin's chunks be? Attention time of whole decode steps by chunk size.

A decode step runs every layer's attention over that layer's own pool, with the layer's weights
streaming through the caches in between, so a layer's K/V comes from memory, not from a warm cache.
This bench reproduces that: one pool per layer (SmolLM2-135M shapes: 30 layers, 3 kv heads, d 64,
16-token blocks scattered at random), a matmul with ~10 MB of weights before each layer's attention,
and the decode plan made once per step. Each chunk size (and "matmul only") runs once per round,
interleaved, so background load hits all alike; the table gives the median attention milliseconds
per step (step minus the matmul-only step).

    .venv/bin/python bench/decode_chunks.py [--shapes 8x300,8x600,...] [--rounds 7] [--threads 1]
        [--layers 30] [--pool-blocks 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixd.kernels.paged_decode import decode_with_plan, plan_for

HKV, GROUP, D, B = 3, 3, 64, 16
CHUNKS_KIB = [256, 512, 1024, 2048, 4096, 8192, 1 << 20]


def measure(batch: int, ctx: int, rounds: int, seed: int, layers: int, pool_blocks: int) -> dict[int, float]:
    """Median attention ms per step for each chunk size (KiB) at `batch` sequences of ~`ctx` tokens."""
    g = torch.Generator().manual_seed(seed)
    ks = [torch.randn(pool_blocks, B, HKV, D, generator=g) for _ in range(layers)]
    vs = [torch.randn(pool_blocks, B, HKV, D, generator=g) for _ in range(layers)]
    weights = [torch.randn(576, 4500, generator=g) for _ in range(layers)]
    per_seq = -(-ctx // B)
    if batch * per_seq >= pool_blocks:
        raise SystemExit(f"{batch}x{ctx} needs {batch * per_seq} blocks, the pool has {pool_blocks - 1}")
    tables = (torch.randperm(pool_blocks - 1, generator=g)[: batch * per_seq] + 1).view(batch, per_seq)
    tables = tables.to(torch.int32)
    lens = torch.randint(max(1, ctx - 60), ctx + 1, (batch,), generator=g, dtype=torch.int32)
    q = torch.randn(batch, HKV * GROUP, D, generator=g)
    x = torch.randn(batch, 576, generator=g)

    def step(chunk_kib: int | None) -> float:
        t0 = time.perf_counter()
        plan = plan_for(tables, lens, ks[0], chunk_bytes=chunk_kib << 10) if chunk_kib else None
        for layer in range(layers):
            x @ weights[layer]
            if plan is not None:
                decode_with_plan(q, ks[layer], vs[layer], plan, D**-0.5)
        return time.perf_counter() - t0

    times: dict[int | None, list[float]] = {c: [] for c in [None, *CHUNKS_KIB]}
    for _ in range(rounds):
        for c in times:
            times[c].append(step(c))
    base = statistics.median(times[None])
    return {c: (statistics.median(v) - base) * 1e3 for c, v in times.items() if c is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8x300,8x600,8x1200,64x80,64x200,32x600,1x2000")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=30, help="pools (and weight matrices) per step")
    ap.add_argument("--pool-blocks", type=int, default=2048, help="blocks of 16 tokens in each layer's pool")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    head = " | ".join("whole batch" if c == 1 << 20 else f"{c} KiB" for c in CHUNKS_KIB)
    print(f"| batch x ctx | {head} |")
    print("| --- |" + " ---: |" * len(CHUNKS_KIB))
    for i, shape in enumerate(args.shapes.split(",")):
        batch, ctx = (int(v) for v in shape.split("x"))
        res = measure(batch, ctx, args.rounds, i, args.layers, args.pool_blocks)
        print(f"| {batch} x {ctx} | " + " | ".join(f"{res[c]:.1f}" for c in CHUNKS_KIB) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
