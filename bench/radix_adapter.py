"""Adapter that drives radixd's RadixTree through the peer bench, radix_peer_bench.py.

NOTE: the peer bench is not part of this repository. It is expected in the folder ``shared/bench/`` next
to the checkout (``../shared/bench/radix_peer_bench.py`` from the repository root; ``--peer-bench PATH``
names another place), and it needs SGLang's sources (``--sglang-src``, by default
``~/.cache/sglang_src``; when they are missing the peer bench downloads SGLang's wheel with pip). Without
the peer bench, ``python bench/radix_adapter.py`` (``make bench-radix``) stops with a message saying so.

Usage (from the repository root)::

    .venv/bin/python bench/radix_adapter.py --repeat 5 --workloads w1,w2      # side by side with SGLang
    .venv/bin/python ../shared/bench/radix_peer_bench.py --adapter bench/radix_adapter.py:Adapter

It runs the engine's own protocol (``daemon/engine/kv.py``), call for call: a request keeps its
tokens packed once (``TokenKey``, as ``Sequence.key`` does), matches them (a lease locks the prefix),
starts a ``BlockTable`` from the matched blocks (``lease_prefix``: no reference per cached block),
appends slots for the rest (``BlockTable.append``), caches the page-aligned part with
``RadixTree.insert_table(..., final=True)`` (the table's new blocks are donated to the tree; as for a
finishing sequence, the lease is not moved onto the inserted path, since it is released next), releases
the table (its unaligned tail block goes back to the pool) and finally the lease. Memory pressure is
met with ``RadixTree.evict_count``, as ``KVManager.ensure_free`` does, and a request's new blocks with
``RadixTree.evict_for_run``, as ``KVManager.append`` does. The pool owns
``capacity_tokens / page_size`` blocks (+ the null block).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixd.radix import BlockPool, BlockTable, Lease, RadixTree, TokenKey
from radixd.radix.verify import check_consistency


class Adapter:
    name = "radixd.RadixTree"

    def __init__(self, page_size: int, capacity_tokens: int) -> None:
        self.page_size = page_size
        self.capacity_blocks = capacity_tokens // page_size
        self.pool = BlockPool(self.capacity_blocks + 1, page_size)
        self.tree = RadixTree(self.pool)

    def prepare(self, tokens: np.ndarray[Any, Any]) -> TokenKey:
        # The tree's packed key form (native int32), kept per request as Sequence.key keeps it.
        return TokenKey(np.ascontiguousarray(tokens, dtype=np.int32).tobytes())  # len() counts tokens

    def match(self, tokens: TokenKey) -> tuple[int, tuple[BlockTable, Lease]]:
        m = self.tree.match(tokens)
        table = BlockTable(self.pool)  # KVManager.attach: the table starts from the leased blocks
        table.lease_prefix(m.block_ids)
        return m.num_tokens, (table, m.lease)

    def free_tokens(self) -> int:
        return self.pool.num_free * self.page_size

    def evict(self, n_tokens: int) -> int:
        return self.tree.evict_count(-(-n_tokens // self.page_size)) * self.page_size

    def insert(self, tokens: TokenKey, handle: tuple[BlockTable, Lease]) -> None:
        table, lease = handle
        n = len(tokens)
        self.tree.evict_for_run(table.new_blocks_for(n - table.num_tokens))  # KVManager.append
        table.append(n - table.num_tokens)
        aligned = n // self.page_size  # the unaligned tail is not cached (the peer's protocol)
        if aligned > table.leased:
            # The key of the cached part; when that is every token, the request's own key (the engine
            # too makes one key per insert: `Sequence.key`, which prepare() stands for).
            key = tokens if aligned * self.page_size == n else tokens[: aligned * self.page_size]
            self.tree.insert_table(key, table, aligned, "", lease, final=True)
        table.release()  # KVManager.release: the table's own blocks (the tail) go back to the pool

    def release(self, handle: tuple[BlockTable, Lease]) -> None:
        handle[1].release()

    def check(self) -> None:
        check_consistency(self.tree)
        if self.tree.num_leases:
            raise RuntimeError(f"{self.tree.num_leases} leases leaked")
        if self.pool.num_free + self.tree.num_cached_blocks != self.capacity_blocks:
            raise RuntimeError("block leak: free + cached != capacity")


def _side_by_side(argv: list[str] | None = None) -> None:
    """Run radixd and SGLang on the same workloads in one process, interleaved, best of --repeat."""
    import argparse
    import gc
    import importlib.util
    import os
    import sys

    ap = argparse.ArgumentParser(description="radixd vs SGLang RadixCache, side by side")
    ap.add_argument(
        "--peer-bench",
        default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench", "radix_peer_bench.py"),
        help="the peer bench (not in this repository; default: ../shared/bench/ from the repository root)",
    )
    ap.add_argument("--sglang-src", default=os.path.expanduser("~/.cache/sglang_src"))
    ap.add_argument("--workloads", default="w1,w2,w3")
    ap.add_argument("--page-sizes", default="1,16")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--w3-leaves",
        default="512,1024,2048,4096,8192",
        help="W3 pool sizes, in cached leaves of 64 tokens (capacity = leaves * 64 tokens)",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also print where each side's time per request goes (match, insert, release, evict)",
    )
    args = ap.parse_args(argv)

    if not os.path.isfile(args.peer_bench):
        raise SystemExit(
            f"bench/radix_adapter.py needs the peer bench radix_peer_bench.py, which is not part of this "
            f"repository: no file at {os.path.abspath(args.peer_bench)}. Put it in shared/bench/ next to "
            "the checkout, or pass --peer-bench PATH."
        )
    spec = importlib.util.spec_from_file_location("radix_peer_bench", args.peer_bench)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {args.peer_bench}")
    pb = importlib.util.module_from_spec(spec)
    sys.modules["radix_peer_bench"] = pb
    spec.loader.exec_module(pb)
    pb.SGLangRadixAdapter.sg = pb.load_sglang(args.sglang_src)
    import torch

    torch.set_num_threads(1)
    bench_args = argparse.Namespace(
        w1_convs=64,
        w1_turns=8,
        w1_system=512,
        w1_user=64,
        w1_output=128,
        w1_capacity=1 << 20,
        w2_requests=5000,
        w2_prompt=1024,
        w2_output=32,
        w2_shared=256,
        w2_share_frac=0.5,
        w2_capacity=20000,
        w3_requests=8000,
        w3_prompt=48,
        w3_output=16,
        w3_capacity=131072,
    )
    adapters = [("sglang", pb.SGLangRadixAdapter), ("radixd", Adapter)]
    print(f"sglang={pb.SGLangRadixAdapter.sg['version']} repeat={args.repeat} (best of, interleaved)")
    print(
        f"{'wl':<3} {'page':>4} {'reqs':>5} {'leaves':>6} | "
        f"{'sglang req/s':>12} {'radixd req/s':>12} {'ratio':>6} | "
        f"{'sgl us/evict':>12} {'rdx us/evict':>12} | hit"
    )
    configs: list[tuple[str, int, int]] = []
    for wl in args.workloads.split(","):
        if wl == "w3":
            configs.extend(
                ("w3", int(ps), int(n))
                for ps in args.page_sizes.split(",")
                for n in args.w3_leaves.split(",")
            )
        else:
            configs.extend((wl, int(ps), 0) for ps in args.page_sizes.split(","))
    for wl, ps, leaves in configs:
        if wl == "w3":  # the pool holds `leaves` requests; 4000 more keep evict() busy in steady state
            bench_args.w3_requests = leaves + 4000
            bench_args.w3_capacity = leaves * 64
        gen = {"w1": pb.workload_w1, "w2": pb.workload_w2, "w3": pb.workload_w3}[wl]
        cap = getattr(bench_args, f"{wl}_capacity")
        reqs = gen(bench_args, 0)
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):
            for name, cls in adapters:
                gc.collect()
                r = pb.run_once(cls, reqs, ps, cap, 8)
                if name not in best or r["tree_s"] < best[name]["tree_s"]:
                    best[name] = r
        s, m = best["sglang"], best["radixd"]
        print(
            f"{wl:<3} {ps:>4} {len(reqs):>5} {leaves or '-':>6} | "
            f"{s['requests_per_s']:>12.0f} {m['requests_per_s']:>12.0f} "
            f"{m['requests_per_s'] / s['requests_per_s']:>5.2f}x | {s['evict_us_per_call']:>12.1f} "
            f"{m['evict_us_per_call']:>12.1f} | {s['hit_rate']:.4f}/{m['hit_rate']:.4f}"
        )
        if args.phases:
            for name, r in (("sglang", s), ("radixd", m)):
                print("    " + _phases(name, r))


def _phases(name: str, r: dict[str, float]) -> str:
    """One side's microseconds per request by operation (the best run's), evictions spread over all
    requests, so the four add up to its time per request."""
    evict = r["evict_us_per_call"] * r["evict_calls"] / r["requests"]
    parts = {"match": r["match_us"], "insert": r["insert_us"], "release": r["release_us"], "evict": evict}
    spelled = " ".join(f"{k} {v:.2f}" for k, v in parts.items())
    return f"{name:<6} us/request: {spelled} = {r['us_per_request']:.2f}"


if __name__ == "__main__":
    _side_by_side()
