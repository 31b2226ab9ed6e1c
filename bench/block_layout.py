"""How a conversation's KV blocks lie in the pool after churn: the runs of consecutive block ids that
its block table holds, which decide how the CPU attention reads its context (a run of r blocks is one
contiguous read of r x 6 KiB a layer, for K and again for V; docs/measurements/bench-kernels.md, seventh run).

The radix core (pool, tree, tables) is driven by the engine's protocol (`daemon/engine/kv.py`: match,
lease, copy a partial block, make room, append the prompt, insert full blocks, decode one token per
step with `append_one_each`, evict LRU when short, insert and release on finish), with no model: only
block ids move. The pool is the daemon's default 1 GiB KV budget for SmolLM2-135M in f16 (2,912 blocks
of 16 tokens, 46,592 token slots). `--run-budget` is `RadixTree.evict_for_run`'s budget, which
`KVManager.append` spends when a prompt's blocks find no free run (the daemon's by default; 0: none).

Trace (deterministic, --seed):
  fresh   one conversation alone in the empty pool: a 1,000-token system prompt and --turns (8) turns
          of a 200-token message and a 64-token reply (the last turn's context ~3,100 tokens; 12 turns:
          ~4,200): the single agent of issue 26 before anything has churned;
  churn   --concurrent (6) conversations at a time, each of 2-8 turns: a system prompt (one of 4,
          500-1,000 tokens), then per turn a user message of 50-300 tokens and a reply of 32-256 tokens
          decoded a token a step beside the others; a finished conversation is replaced by a new one,
          until the tree has evicted --churn (4) pools' worth of blocks;
  agent   then the same agent (a new system prompt) alone in the churned, full pool;
  busy    then once more, decoded beside the churn's conversations.

Reported per agent: its table's blocks, runs, mean and median run (blocks), and the share of its blocks
in runs of at least 16; and the trace's evictions and prefix hit rate. With `--tables DIR` it writes each
table's block ids, one per line, which `bench/offline.py --layout DIR/agent.txt` runs the product's step on.

    .venv/bin/python bench/block_layout.py [--run-budget K] [--tables DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchkit import EngineConfig, KVManager

from radixd.radix import (
    RUN_EVICTION_BUDGET,
    BlockTable,
    KVSpec,
    Lease,
    OutOfBlocks,
    append_one_each,
    encode_tokens,
)

SMOLLM2_F16 = KVSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=2, block_size=16)
VOCAB = 49152


@dataclass
class Conversation:
    """One conversation's tokens and the turns it still has."""

    tokens: list[int]
    turns: list[tuple[int, int]]  # (user message tokens, reply tokens) still to run
    table: BlockTable | None = None
    lease: Lease | None = None
    reply_left: int = 0
    history: list[int] = field(default_factory=list)


class Core:
    """The radix core as the engine drives it, through `KVManager` (daemon/engine/kv.py) where a call
    takes no `Sequence`, without a model."""

    def __init__(self, num_blocks: int, run_budget: int) -> None:
        self.kv = KVManager.create(num_blocks, SMOLLM2_F16.block_size, EngineConfig())
        self.pool = self.kv.pool
        self.tree = self.kv.tree
        self.run_budget = run_budget
        self.ensure_free = self.kv.ensure_free

    @property
    def evicted(self) -> int:
        return self.kv.evicted_blocks

    def start_turn(self, c: Conversation) -> bool:
        """Admit a turn's prompt (match, lease, copy, prefill); False when the pool cannot hold it."""
        key = encode_tokens(c.tokens)
        m = self.tree.match(key[:-1])
        table = BlockTable(self.pool)
        table.lease_prefix(m.block_ids)
        need = table.new_blocks_for(len(c.tokens) - table.num_tokens) + (1 if m.partial_block else 0)
        if not self.ensure_free(need):
            m.lease.release()
            return False
        if m.partial_block:
            table.copy_partial(m.partial_block, m.partial_tokens)
        grow = table.new_blocks_for(len(c.tokens) - table.num_tokens)  # as KVManager.append does
        self.kv.evicted_blocks += self.tree.evict_for_run(grow, self.run_budget * grow)
        table.append(len(c.tokens) - table.num_tokens)
        n_full = len(c.tokens) // self.pool.block_size
        self.tree.insert_table(key[: n_full * self.pool.block_size], table, n_full, "", m.lease)
        c.table, c.lease = table, m.lease
        return True

    def end_turn(self, c: Conversation) -> None:
        assert c.table is not None and c.lease is not None
        key = encode_tokens(c.tokens)
        self.tree.insert_table(key, c.table, c.table.num_blocks, "", c.lease, final=True)
        c.table.release()
        c.lease.release()
        c.table, c.lease = None, None


def new_conversation(rng: random.Random, systems: list[list[int]]) -> Conversation:
    turns = [(rng.randint(50, 300), rng.randint(32, 256)) for _ in range(rng.randint(2, 8))]
    return Conversation(tokens=list(rng.choice(systems)), turns=turns)


def words(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def step(core: Core, running: list[Conversation], rng: random.Random) -> list[Conversation]:
    """One engine step: decode a token for each running conversation; -> the ones whose turn ended."""
    live = [c for c in running if c.table is not None]
    if not live:
        return []
    try:
        append_one_each([c.table for c in live if c.table is not None], core.ensure_free)
    except OutOfBlocks:
        return live  # the pool is full of running work: end these turns (a preemption, in the engine)
    done: list[Conversation] = []
    for c in live:
        c.tokens.append(rng.randrange(1, VOCAB))
        c.reply_left -= 1
        if c.reply_left == 0:
            done.append(c)
    return done


def advance(core: Core, c: Conversation, rng: random.Random) -> bool:
    """End a turn and start the next; False when the conversation is over."""
    if c.table is not None:
        c.history = list(c.table.blocks)
        core.end_turn(c)
    if not c.turns:
        return False
    user, reply = c.turns.pop(0)
    c.tokens += words(rng, user)
    c.reply_left = reply
    if core.start_turn(c):
        return True
    c.turns = []
    return False


def runs_of(blocks: list[int]) -> list[int]:
    """Lengths of the runs of consecutive ids in `blocks`, in table order."""
    out: list[int] = []
    for i, b in enumerate(blocks):
        if i and b == blocks[i - 1] + 1:
            out[-1] += 1
        else:
            out.append(1)
    return out


def report(name: str, blocks: list[int], tables: Path | None) -> str:
    runs = runs_of(blocks)
    long = sum(r for r in runs if r >= 16) / len(blocks)
    if tables is not None:
        tables.mkdir(parents=True, exist_ok=True)
        (tables / f"{name}.txt").write_text("".join(f"{b}\n" for b in blocks))
    return (
        f"| {name} | {len(blocks)} | {len(runs)} | {statistics.mean(runs):.1f} | "
        f"{statistics.median(runs):.0f} | {100 * long:.0f}% |"
    )


def agent_rows(
    core: Core,
    name: str,
    system: list[int],
    others: list[Conversation],
    rng: random.Random,
    tables: Path | None,
    refill: Callable[[], None] | None,
    turns: int,
) -> str:
    """Run the agent's turns (beside `others`, refilled by `refill`); -> its table's report row."""
    agent = Conversation(tokens=list(system), turns=[(200, 64)] * turns)
    if not advance(core, agent, rng):
        raise SystemExit("the pool could not hold the agent's first turn")
    while True:
        for c in step(core, [agent, *others], rng):
            if c is not agent:
                if not advance(core, c, rng):
                    others.remove(c)
                continue
            if not agent.turns:
                row = report(name, list(agent.table.blocks) if agent.table is not None else [], tables)
                advance(core, agent, rng)
                return row
            if not advance(core, agent, rng):
                raise SystemExit(f"the pool could not hold the {name} agent's next turn")
        if refill is not None:
            refill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrent", type=int, default=6)
    ap.add_argument("--churn", type=float, default=4.0, help="pools' worth evicted before the agent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--turns", type=int, default=8, help="the agent's turns")
    ap.add_argument(
        "--run-budget",
        type=int,
        default=RUN_EVICTION_BUDGET,
        help="evict_for_run's budget per block asked (the daemon's by default; 0: none)",
    )
    ap.add_argument("--tables", type=Path, default=None, help="write each table's block ids under DIR")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    core = Core(SMOLLM2_F16.blocks_for_budget(1 << 30), args.run_budget)
    systems = [words(rng, rng.randint(500, 1000)) for _ in range(4)]
    running: list[Conversation] = []

    def fill() -> None:
        while len(running) < args.concurrent:
            c = new_conversation(rng, systems)
            if advance(core, c, rng):
                running.append(c)

    rows = [agent_rows(core, "fresh", words(rng, 1000), [], rng, args.tables, None, args.turns)]
    fill()
    while core.evicted < args.churn * core.pool.num_blocks:
        for c in step(core, running, rng):
            if not advance(core, c, rng):
                running.remove(c)
        fill()

    rows.append(agent_rows(core, "agent", words(rng, 1000), [], rng, args.tables, None, args.turns))
    rows.append(agent_rows(core, "busy", words(rng, 1000), running, rng, args.tables, fill, args.turns))
    stats = core.tree.stats()
    print(
        f"pool {core.pool.num_blocks} blocks; {core.evicted} evicted during the trace; "
        f"prefix hit rate {100 * stats.hit_rate:.1f}%"
    )
    print("| table | blocks | runs | mean run | median run | blocks in runs >= 16 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
