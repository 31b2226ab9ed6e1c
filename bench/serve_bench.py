"""gRPC load generator for radixd: multi-turn chat and agent-fork workloads over loopback.

    .venv/bin/python bench/serve_bench.py                       # starts its own daemons, both workloads
    .venv/bin/python bench/serve_bench.py --address 127.0.0.1:50051 --workload chat

Without --address it starts `radixd serve` twice on free loopback ports, once with prefix caching and
once with --no-prefix-cache, runs the same workload against each, and reports both side by side
(throughput, TTFT p50/p99, inter-token latency p50/p99, cache hit rate). Everything is bounded:
fixed numbers of users, turns and tokens, greedy decoding, loopback only.

Workloads:
  chat   N concurrent users, each a session (shared system prompt) taking T turns.
  agent  N concurrent agents, each a session with a task, one planning turn, then a fork into K
         children that take one step each in parallel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

from benchkit import Daemon
from radixd_client import AsyncClient, AsyncSession, Chunk, End, Start

SYSTEM = (
    "You are a helpful assistant for a software team. You answer questions about build systems, testing,"
    " code review and release management. Be concise and concrete; prefer short lists.\n"
    "Team conventions: every change goes through a pull request with at least one approving review; the"
    " main branch must always build; tests run on every push; flaky tests are quarantined within a day and"
    " fixed within a week; releases are cut from release branches named release/X.Y; hotfixes are merged to"
    " main first and then cherry-picked; every release has a changelog entry, a rollback plan and an owner."
    " The CI pipeline runs lint, type checks, unit tests, integration tests and a packaging step; the"
    " integration tests start real services on loopback ports and must finish in under ten minutes."
    " Reviewers check naming, error messages, tests that can fail, documentation of public interfaces and"
    " that no secrets or credentials are committed. Incidents get a written timeline and follow-up tasks."
)
QUESTIONS = (
    "How should we structure our test suite?",
    "What belongs in a code review checklist?",
    "How do we cut a release branch safely?",
    "How can we speed up CI?",
    "What should a rollback plan contain?",
    "How do we track flaky tests?",
)


@dataclass
class Sample:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    itl_s: list[float]


@dataclass
class Result:
    label: str
    wall_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        ttft = sorted(s.ttft_s for s in self.samples)
        itl = sorted(x for s in self.samples for x in s.itl_s)
        prompt = sum(s.prompt_tokens for s in self.samples)
        out = sum(s.completion_tokens for s in self.samples)
        return {
            "requests": len(self.samples),
            "gen_tok_per_s": out / self.wall_s if self.wall_s else 0.0,
            "total_tok_per_s": (prompt + out) / self.wall_s if self.wall_s else 0.0,
            "ttft_p50_ms": _pct(ttft, 50) * 1000,
            "ttft_p99_ms": _pct(ttft, 99) * 1000,
            "itl_p50_ms": _pct(itl, 50) * 1000,
            "itl_p99_ms": _pct(itl, 99) * 1000,
            "hit_rate": sum(s.cached_tokens for s in self.samples) / prompt if prompt else 0.0,
            "wall_s": self.wall_s,
        }


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[min(98, max(0, int(p) - 1))]


async def _turn(session: AsyncSession, text: str, max_tokens: int) -> Sample:
    t0 = time.perf_counter()
    first: float | None = None
    last = t0
    itl: list[float] = []
    start: Start | None = None
    end: End | None = None
    stream = session.send(
        [{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0.0, ignore_eos=True
    )
    async for event in stream:
        now = time.perf_counter()
        if isinstance(event, Start):
            start = event
        elif isinstance(event, Chunk) and event.token_ids:
            if first is None:
                first = now
            else:
                itl.append(now - last)
            last = now
        elif isinstance(event, End):
            end = event
    if start is None or end is None:
        raise RuntimeError("stream ended without start / end messages")
    return Sample(start.prompt_tokens, start.cached_tokens, end.completion_tokens, (first or last) - t0, itl)


async def chat_workload(client: AsyncClient, users: int, turns: int, max_tokens: int) -> list[Sample]:
    async def user(u: int) -> list[Sample]:
        s = await client.create_session([{"role": "system", "content": SYSTEM}])
        out = []
        for t in range(turns):
            out.append(await _turn(s, f"(user {u}) {QUESTIONS[(u + t) % len(QUESTIONS)]}", max_tokens))
        await s.close(drop_cache=False)
        return out

    return [x for xs in await asyncio.gather(*(user(u) for u in range(users))) for x in xs]


async def agent_workload(client: AsyncClient, agents: int, forks: int, max_tokens: int) -> list[Sample]:
    async def agent(a: int) -> list[Sample]:
        s = await client.create_session([{"role": "system", "content": SYSTEM}])
        out = [
            await _turn(
                s, f"(agent {a}) Plan a migration of our CI to a new runner, in {forks} steps.", max_tokens
            )
        ]
        children = await s.fork(forks)
        out += await asyncio.gather(
            *(_turn(c, f"Carry out step {i + 1}.", max_tokens) for i, c in enumerate(children))
        )
        for c in children:
            await c.close()
        await s.close()
        return out

    return [x for xs in await asyncio.gather(*(agent(a) for a in range(agents))) for x in xs]


async def run_workload(address: str, args: argparse.Namespace, workload: str, label: str) -> Result:
    async with AsyncClient(address) as client:
        await _turn(await client.create_session("warm up"), "hello", 2)  # load kernels, allocate
        res = Result(label)
        t0 = time.perf_counter()
        if workload == "chat":
            res.samples = await chat_workload(client, args.concurrency, args.turns, args.max_tokens)
        else:
            res.samples = await agent_workload(client, args.concurrency, args.forks, args.max_tokens)
        res.wall_s = time.perf_counter() - t0
        return res


def table(results: list[Result]) -> str:
    cols = (
        "requests",
        "gen_tok_per_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "hit_rate",
        "wall_s",
    )
    lines = ["| run | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in results:
        s = r.summary()
        lines.append(
            f"| {r.label} | "
            + " | ".join(f"{s[c]:.3g}" if c != "requests" else str(int(s[c])) for c in cols)
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", help="an already running daemon (loopback); default: start our own")
    p.add_argument("--workload", choices=("chat", "agent", "both"), default="both")
    p.add_argument("--concurrency", type=int, default=4, help="users / agents in parallel")
    p.add_argument("--turns", type=int, default=3, help="chat turns per user")
    p.add_argument("--forks", type=int, default=4, help="parallel steps per agent")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--no-baseline", action="store_true", help="skip the --no-prefix-cache comparison run")
    p.add_argument("--serve-args", default="", help="extra `radixd serve` flags for self-started daemons")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON as well")
    args = p.parse_args()
    if args.address and not args.address.startswith(("127.0.0.1:", "localhost:", "[::1]:")):
        p.error("serve_bench only talks to loopback addresses")
    workloads = ("chat", "agent") if args.workload == "both" else (args.workload,)
    results: list[Result] = []
    configs = (
        [("cache", [])]
        if args.address or args.no_baseline
        else [("cache", []), ("no-cache", ["--no-prefix-cache"])]
    )
    for name, extra in configs:
        daemon = None if args.address else Daemon(extra + args.serve_args.split())
        address = args.address or daemon.address  # type: ignore[union-attr]
        try:
            for w in workloads:
                results.append(asyncio.run(run_workload(address, args, w, f"{w} / {name}")))
                print(f"done: {w} / {name}", file=sys.stderr)
        finally:
            if daemon is not None:
                daemon.stop()
    print(table(results))
    if len(configs) == 2:
        print()
        for w in workloads:
            a = next(r.summary() for r in results if r.label == f"{w} / cache")
            b = next(r.summary() for r in results if r.label == f"{w} / no-cache")
            speedup = a["gen_tok_per_s"] / max(b["gen_tok_per_s"], 1e-9)
            ttft = a["ttft_p50_ms"] / max(b["ttft_p50_ms"], 1e-9)
            print(f"{w}: cache vs no-cache  throughput x{speedup:.2f}, TTFT p50 x{ttft:.2f}")
    if args.json:
        print(json.dumps({r.label: r.summary() for r in results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
