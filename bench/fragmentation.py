"""KV-cache memory waste and concurrency under four allocation policies, on one documented trace.

Trace (deterministic, --seed): --requests (200) requests, all queued at t=0 and served FCFS by a step loop
(each step: admit from the queue head while memory allows, then every running sequence decodes one
token). Prompts are uniform in [500, 1000] tokens, completions normal(200, 40) clipped to [100, 300],
context limit 8,192 tokens. Variant "shared": every prompt starts with one of 4 system prompts of 400
tokens and asks for n=4 parallel samples (4 completions of independent lengths).

Memory budget: --budget-gib of KV for Llama-3-8B (131,072 B/token, radixd.radix.KVSpec) -> token slots.

Policies:
  static      contiguous reservation of the full 8,192-token context per sequence (first-fit placement)
  orca-dL     contiguous reservation grown in increments of dL tokens (realloc + copy when the
              neighbour is taken; first-fit), dL = --orca-dl
  paged-B     BlockPool + BlockTable (B in {8, 16, 32}): blocks allocated on demand, no sharing
  radix-16    BlockPool + RadixTree + BlockTable, B = 16: prompts matched against the cache, shared
              prefixes held once, partial blocks copied, n samples via BlockTable.fork (CoW)
When memory runs out mid-decode the most recently admitted request is preempted (recompute).

Reported, as shares of the budget averaged over the steps while requests are waiting (saturation):
  used         slots holding KV some running sequence reads (shared slots counted once)
  internal     allocated slots past the sequence's final length (never written)
  reservation  allocated slots the sequence will still write (reserved ahead of time)
  external     free slots that cannot serve the waiting request (no contiguous hole is big enough
               although the total free space would be)
plus max and mean concurrency (running requests) and the steps needed to drain the trace.

Command (writes the markdown table to stdout; docs/memory.md holds a copy):
  .venv/bin/python bench/fragmentation.py
"""

from __future__ import annotations

import argparse
import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from radixd.radix import LLAMA3_8B, BlockPool, BlockTable, Lease, OutOfBlocks, RadixTree

CONTEXT_LIMIT = 8192


@dataclass
class Request:
    rid: int
    prompt: tuple[int, ...]
    finals: list[int]  # final length (prompt + completion) of each sample


@dataclass
class Seq:
    final: int
    length: int
    reserved: int = 0  # contiguous policies: slots reserved
    table: BlockTable | None = None


@dataclass
class Running:
    req: Request
    seqs: list[Seq]
    lease: Lease | None = None
    extra: dict[str, int] = field(default_factory=dict)


def make_trace(n: int, shared: bool, seed: int) -> list[Request]:
    rng = np.random.default_rng([seed, int(shared)])
    systems = [rng.integers(0, 32000, 400).tolist() for _ in range(4)]
    out = []
    for i in range(n):
        plen = int(rng.integers(500, 1001))
        toks = rng.integers(0, 32000, plen).tolist()
        if shared:
            toks[:400] = systems[int(rng.integers(4))]
            toks[400] = 100_000 + i
        else:
            toks[0] = 100_000 + i
        samples = 4 if shared else 1
        comps = np.clip(rng.normal(200, 40, samples).round(), 100, 300).astype(int).tolist()
        out.append(Request(i, tuple(toks), [min(CONTEXT_LIMIT, plen + c) for c in comps]))
    return out


class Policy(Protocol):
    name: str

    def admit(self, req: Request) -> Running | None: ...
    def grow(self, run: Running, seq: Seq) -> bool: ...
    def free(self, run: Running) -> None: ...
    def account(self, running: list[Running], waiting: Request | None) -> tuple[int, int, int, int]: ...


# ----------------------------------------------------------------------------- contiguous policies
class Arena:
    """First-fit contiguous allocator over [0, capacity) token slots."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.starts: list[int] = []
        self.sizes: dict[int, int] = {}

    def holes(self) -> list[tuple[int, int]]:
        out, pos = [], 0
        for s in self.starts:
            if s > pos:
                out.append((pos, s - pos))
            pos = s + self.sizes[s]
        if pos < self.capacity:
            out.append((pos, self.capacity - pos))
        return out

    def alloc(self, size: int) -> int | None:
        for start, length in self.holes():
            if length >= size:
                bisect.insort(self.starts, start)
                self.sizes[start] = size
                return start
        return None

    def free(self, start: int) -> None:
        self.starts.remove(start)
        del self.sizes[start]

    def grow_in_place(self, start: int, new_size: int) -> bool:
        i = self.starts.index(start)
        limit = self.starts[i + 1] if i + 1 < len(self.starts) else self.capacity
        if start + new_size <= limit:
            self.sizes[start] = new_size
            return True
        return False

    def free_total(self) -> int:
        return self.capacity - sum(self.sizes.values())


class Contiguous:
    def __init__(self, capacity: int, chunk: int | None) -> None:
        self.name = "static" if chunk is None else f"orca-dL={chunk}"
        self.chunk = chunk
        self.arena = Arena(capacity)
        self.where: dict[int, int] = {}  # id(seq) -> start

    def _size(self, length: int) -> int:
        if self.chunk is None:
            return CONTEXT_LIMIT
        return min(CONTEXT_LIMIT, -(-length // self.chunk) * self.chunk)

    def admit(self, req: Request) -> Running | None:
        plen = len(req.prompt)
        seqs = [Seq(final=f, length=plen) for f in req.finals]
        placed: list[Seq] = []
        for s in seqs:
            start = self.arena.alloc(self._size(plen + 1))
            if start is None:
                for p in placed:
                    self.arena.free(self.where.pop(id(p)))
                return None
            s.reserved = self._size(plen + 1)
            self.where[id(s)] = start
            placed.append(s)
        return Running(req, seqs)

    def grow(self, run: Running, seq: Seq) -> bool:
        need = seq.length + 1
        if need > seq.reserved:
            new = self._size(need)
            start = self.where[id(seq)]
            if not self.arena.grow_in_place(start, new):
                moved = self.arena.alloc(new)
                if moved is None:
                    return False
                self.arena.free(start)
                self.where[id(seq)] = moved
            seq.reserved = new
        seq.length = need
        return True

    def free(self, run: Running) -> None:
        for s in run.seqs:
            self.arena.free(self.where.pop(id(s)))

    def account(self, running: list[Running], waiting: Request | None) -> tuple[int, int, int, int]:
        used = internal = reservation = 0
        for r in running:
            for s in r.seqs:
                used += s.length
                internal += max(0, s.reserved - max(s.final, s.length))
                reservation += max(0, min(s.reserved, s.final) - s.length)
        external = 0
        if waiting is not None:
            need = self._size(len(waiting.prompt) + 1)
            free = self.arena.free_total()
            if free >= need and max((h for _s, h in self.arena.holes()), default=0) < need:
                external = free
        return used, internal, reservation, external


# ---------------------------------------------------------------------------------- paged policies
class Paged:
    def __init__(self, capacity: int, block_size: int, radix: bool) -> None:
        self.B = block_size
        self.pool = BlockPool(capacity // block_size + 1, block_size)
        self.tree = RadixTree(self.pool) if radix else None
        self.name = f"radix-{block_size}" if radix else f"paged-{block_size}"
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def _reserve(self, n_blocks: int) -> bool:
        short = n_blocks - self.pool.num_free
        if short > 0 and self.tree is not None:
            self.tree.evict(short)
        return self.pool.num_free >= n_blocks

    def admit(self, req: Request) -> Running | None:
        B = self.B
        plen = len(req.prompt)
        if self.tree is None:
            need = len(req.finals) * (plen // B + 1)
            if not self._reserve(need):
                return None
            seqs = []
            for f in req.finals:
                t = BlockTable(self.pool)
                t.append_slots(plen)
                seqs.append(Seq(final=f, length=plen, table=t))
            return Running(req, seqs)
        m = self.tree.match(req.prompt[:-1])
        cached = m.num_tokens
        need = (plen - cached) // B + 2 + len(req.finals)  # rest of the prompt, CoW of forked last blocks
        if not self._reserve(need):
            m.lease.release()
            return None
        t = BlockTable(self.pool)  # the engine's protocol (KVManager): the lease keeps the matched blocks
        t.lease_prefix(m.block_ids)
        if m.partial_block is not None:
            t.copy_partial(m.partial_block, m.partial_tokens)
        t.append_slots(plen - t.num_tokens)
        self.hit_tokens += m.cached_tokens
        self.prompt_tokens += plen
        n_full = plen // B  # later requests share this prompt's full blocks; the lease moves onto them
        self.tree.insert_table(req.prompt[: n_full * B], t, n_full, "", m.lease)
        tables = [t, *t.fork(len(req.finals) - 1)]
        return Running(
            req,
            [Seq(final=f, length=plen, table=x) for f, x in zip(req.finals, tables, strict=True)],
            lease=m.lease,
        )

    def grow(self, run: Running, seq: Seq) -> bool:
        assert seq.table is not None
        try:
            seq.table.append_slots(1)
        except OutOfBlocks:
            if self.tree is None or not self.tree.evict(2):
                return False
            try:
                seq.table.append_slots(1)
            except OutOfBlocks:
                return False
        seq.length += 1
        return True

    def free(self, run: Running) -> None:
        for s in run.seqs:
            if s.table is not None:
                s.table.release()
        if run.lease is not None:
            run.lease.release()

    def account(self, running: list[Running], waiting: Request | None) -> tuple[int, int, int, int]:
        B = self.B
        evictable = self.tree.evictable_blocks() if self.tree is not None else 0
        allocated = (self.pool.num_usable - self.pool.num_free - evictable) * B
        internal = reservation = 0
        seen: set[int] = set()
        for r in running:
            for s in r.seqs:
                assert s.table is not None
                last = s.table.blocks[-1]
                if last in seen:
                    continue
                seen.add(last)
                slack = len(s.table.blocks) * B - s.length
                beyond = max(0, len(s.table.blocks) * B - max(s.final, s.length))
                internal += beyond
                reservation += slack - beyond
        return allocated - internal - reservation, internal, reservation, 0


# --------------------------------------------------------------------------------------- simulation
def simulate(policy: Policy, trace: list[Request], budget: int) -> dict[str, float]:
    queue = deque(trace)
    running: list[Running] = []
    steps = 0
    sums = np.zeros(4)
    sat_steps = 0
    max_conc = 0
    conc_sum = 0
    while queue or running:
        while queue:
            run = policy.admit(queue[0])
            if run is None:
                break
            queue.popleft()
            running.append(run)
        if not running:
            raise SystemExit(f"{policy.name}: a request does not fit in the budget at all")
        max_conc = max(max_conc, len(running))
        conc_sum += len(running)
        for run in list(running):
            if run not in running:
                continue
            for seq in run.seqs:
                while seq.length < seq.final and not policy.grow(run, seq):
                    victim = running.pop()  # preempt the newest request (recompute later)
                    policy.free(victim)
                    queue.appendleft(victim.req)
                    if victim is run:
                        break
                if run not in running:
                    break
        if queue:
            sums += policy.account(running, queue[0])
            sat_steps += 1
        done = [r for r in running if all(s.length >= s.final for s in r.seqs)]
        for r in done:
            running.remove(r)
            policy.free(r)
        steps += 1
    avg = sums / max(1, sat_steps) / budget * 100
    return {
        "used": avg[0],
        "internal": avg[1],
        "reservation": avg[2],
        "external": avg[3],
        "max_conc": max_conc,
        "mean_conc": conc_sum / steps,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="KV fragmentation under allocation policies")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--budget-gib", type=float, default=8.0)
    ap.add_argument("--orca-dl", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    budget = int(args.budget_gib * 2**30) // LLAMA3_8B.bytes_per_token
    print(
        f"budget: {args.budget_gib:g} GiB of Llama-3-8B KV = {budget:,} token slots "
        f"({LLAMA3_8B.bytes_per_token:,} B/token); {args.requests} requests per trace; seed {args.seed}\n"
    )
    cols = ["trace", "policy", "used %", "internal %", "reservation %", "external %"]
    cols += ["max conc.", "mean conc.", "steps"]
    print("| " + " | ".join(cols) + " |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for shared in (False, True):
        trace = make_trace(args.requests, shared, args.seed)
        policies: list[Policy] = [Contiguous(budget, None), Contiguous(budget, args.orca_dl)]
        policies += [Paged(budget, b, radix=False) for b in (8, 16, 32)]
        policies.append(Paged(budget, 16, radix=True))
        label = "shared system prompt, n=4" if shared else "distinct prompts, n=1"
        for p in policies:
            r = simulate(p, trace, budget)
            print(
                f"| {label} | {p.name} | {r['used']:.1f} | {r['internal']:.1f} | {r['reservation']:.1f} | "
                f"{r['external']:.1f} | {r['max_conc']:.0f} | {r['mean_conc']:.1f} | {r['steps']:.0f} |"
            )


if __name__ == "__main__":
    main()
