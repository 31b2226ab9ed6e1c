"""Scheduler workloads, in-process, with the prefix cache on and off in the same run.

    .venv/bin/python bench/workloads.py                 # all four workloads, 64 generated tokens
    .venv/bin/python bench/workloads.py --workloads chat --repeat 3   # chat target: paired on/off runs

(1) chat: 8 conversations x 4 turns, one shared 300-token system prompt, 40-token user turns.
(2) agent: a 1,000-token context (a session) forked into 8 branches x 3 steps (20-token tool results).
(3) n8: n=8 parallel sampling of a 1,000-token prompt (copy-on-write forks).
(4) fewshot: a 1,000-token few-shot prefix shared by 64 questions (20 tokens each).

Per workload and cache setting: wall time, generated tokens/s, TTFT p50/p99, hit rate (cached /
prompt tokens) against the trace's theoretical maximum, and peak KV blocks. The theoretical maximum
counts, for each request in submission order, the longest prefix it shares with any earlier request's
prompt + output, capped one token short of its prompt (that token is always computed for logits).
Prompts are seeded random token ids; generation is greedy with ignore_eos (fixed lengths), except (3),
which samples with seeds.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from benchkit import (
    EngineConfig,
    EngineCore,
    GenerateRequest,
    LoadedModel,
    RequestOutput,
    SamplingParams,
    build_core,
    load_model,
)


@dataclass
class Trace:
    """What a workload did: each request's prompt, outputs, cached tokens and TTFT, in submission order."""

    prompts: list[list[int]] = field(default_factory=list)
    outputs: list[list[list[int]]] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)


class Driver:
    """Submits rounds of requests to a core and records them in the trace."""

    def __init__(self, core: EngineCore, scale: float = 1.0) -> None:
        self.core = core
        self.trace = Trace()
        self.scale = scale  # every prompt part's length is multiplied by this (--scale)

    def tokens(self, rng: random.Random, n: int) -> list[int]:
        """`n` x scale random ordinary token ids (at least 1)."""
        return [rng.randrange(1000, 30000) for _ in range(max(1, round(n * self.scale)))]

    def round(
        self, reqs: list[GenerateRequest], full_prompts: list[list[int]] | None = None
    ) -> list[list[list[int]]]:
        """Run `reqs` concurrently to the end; `full_prompts`: session turns' prompts incl. history."""
        outs: dict[tuple[str, int], list[RequestOutput]] = {}

        def sink(o: RequestOutput) -> None:
            outs.setdefault((o.request_id, o.index), []).append(o)

        for r in reqs:
            self.core.requests.add(r, sink)
        self.core.run_until_idle()
        result = []
        for k, r in enumerate(reqs):
            per = [[t for o in outs[(r.request_id, i)] for t in o.new_token_ids] for i in range(r.sampling.n)]
            last = outs[(r.request_id, 0)][-1]
            if last.finish_reason == "error":
                raise RuntimeError(f"{r.request_id}: {last.error}")
            first = next(o for o in outs[(r.request_id, 0)] if o.ttft_s is not None)
            self.trace.prompts.append(full_prompts[k] if full_prompts else list(r.prompt_token_ids))
            self.trace.outputs.append(per)
            self.trace.cached.append(last.cached_tokens)
            self.trace.ttft.append(first.ttft_s or 0.0)
            result.append(per)
        return result


def greedy(gen: int) -> SamplingParams:
    return SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)


def wl_chat(d: Driver, gen: int) -> None:
    rng = random.Random(1)
    system = d.tokens(rng, 300)
    history = [list(system) for _ in range(8)]
    for turn in range(4):
        reqs = [
            GenerateRequest(f"chat-{c}-{turn}", history[c] + d.tokens(rng, 40), greedy(gen)) for c in range(8)
        ]
        outs = d.round(reqs)
        for c, r in enumerate(reqs):
            history[c] = list(r.prompt_token_ids) + outs[c][0]


def wl_agent(d: Driver, gen: int) -> None:
    rng = random.Random(2)
    core = d.core
    core.sessions.create("agent")
    context = d.tokens(rng, 1000)
    d.round([GenerateRequest("agent-0", context, greedy(gen), session_id="agent")], [context])
    branches = [s.session_id for s in core.sessions.fork("agent", 8)]
    for step in range(3):
        reqs, full = [], []
        for b, sid in enumerate(branches):
            turn = d.tokens(rng, 20)
            full.append(list(core.sessions.get(sid).tokens) + turn)
            reqs.append(GenerateRequest(f"agent-{b}-{step}", turn, greedy(gen), session_id=sid))
        d.round(reqs, full)
    for sid in [*branches, "agent"]:
        core.sessions.close(sid)


def wl_n8(d: Driver, gen: int) -> None:
    rng = random.Random(3)
    params = SamplingParams(max_tokens=gen, temperature=0.8, top_p=0.95, seed=11, n=8, ignore_eos=True)
    d.round([GenerateRequest("n8", d.tokens(rng, 1000), params)])


def wl_fewshot(d: Driver, gen: int) -> None:
    rng = random.Random(4)
    prefix = d.tokens(rng, 1000)
    d.round([GenerateRequest(f"fs-{i}", prefix + d.tokens(rng, 20), greedy(gen)) for i in range(64)])


WORKLOADS: dict[str, Callable[[Driver, int], None]] = {
    "chat": wl_chat,
    "agent": wl_agent,
    "n8": wl_n8,
    "fewshot": wl_fewshot,
}


def lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i + 64 <= n and a[i : i + 64] == b[i : i + 64]:
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i


def theoretical_max(trace: Trace) -> int:
    seen: list[list[int]] = []
    total = 0
    for prompt, outs in zip(trace.prompts, trace.outputs, strict=True):
        best = max((lcp(prompt, s) for s in seen), default=0)
        total += min(best, len(prompt) - 1)
        seen.extend(prompt + o for o in outs)
    return total


@dataclass
class Row:
    workload: str
    cache: str
    wall_s: float
    gen_tokens: int
    tok_s: float
    ttft_p50: float
    ttft_p99: float
    hit: float
    hit_max: float
    peak_blocks: int
    peak_active: int
    unshared_peak: int
    preemptions: int
    run: int = 1


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, round(q * (len(ys) - 1)))]


def run_one(lm: LoadedModel, name: str, caching: bool, args: argparse.Namespace) -> Row:
    core = build_core(lm, EngineConfig(prefix_caching=caching), num_blocks=args.num_blocks)
    d = Driver(core, args.scale)
    t0 = time.perf_counter()
    WORKLOADS[name](d, args.gen)
    wall = time.perf_counter() - t0
    tr = d.trace
    prompt_total = sum(len(p) for p in tr.prompts)
    gen_total = sum(len(o) for outs in tr.outputs for o in outs)
    stats = core.stats()
    unshared = 8 * core.kv.blocks_for(len(tr.prompts[0]) + args.gen) if name == "n8" else 0
    return Row(
        name, "on" if caching else "off", wall, gen_total, gen_total / wall,
        pct(tr.ttft, 0.5), pct(tr.ttft, 0.99), sum(tr.cached) / prompt_total,
        theoretical_max(tr) / prompt_total, stats.peak_used_blocks, stats.peak_active_blocks, unshared,
        stats.preemptions,
    )  # fmt: skip


def table(rows: list[Row]) -> str:
    head = (
        "| workload | cache | run | wall s | gen tok/s | TTFT p50 s | TTFT p99 s | hit rate | max hit rate"
        " | hit/max | peak blocks (all / active) | preemptions |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        frac = r.hit / r.hit_max if r.hit_max else 0.0
        lines.append(
            f"| {r.workload} | {r.cache} | {r.run} | {r.wall_s:.1f} | {r.tok_s:.1f} | {r.ttft_p50:.2f}"
            f" | {r.ttft_p99:.2f} | {r.hit:.1%} | {r.hit_max:.1%} | {frac:.1%}"
            f" | {r.peak_blocks} / {r.peak_active} | {r.preemptions} |"
        )
    return "\n".join(lines)


def speedups(rows: list[Row], workload: str) -> str:
    """Cache off wall / cache on wall of each on/off pair (run k with run k): median, then each."""
    on = {r.run: r for r in rows if r.workload == workload and r.cache == "on"}
    off = {r.run: r for r in rows if r.workload == workload and r.cache == "off"}
    ratios = [off[k].wall_s / on[k].wall_s for k in sorted(on) if k in off]
    if not ratios:
        return ""
    each = f" (pairs: {' / '.join(f'{x:.2f}x' for x in ratios)})" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}x{each}"


def summary(rows: list[Row]) -> str:
    first = {(r.workload, r.cache): r for r in rows if r.run == 1}
    out = []
    if sp := speedups(rows, "chat"):
        on = first[("chat", "on")]
        out.append(f"- chat: cache on is {sp} faster than off (target >= 2x);"
                   f" hit rate {on.hit / on.hit_max:.1%} of the maximum (target >= 95%)")  # fmt: skip
    if ("fewshot", "on") in first:
        on = first[("fewshot", "on")]
        sp = speedups(rows, "fewshot")
        tail = f"; {sp} faster than off" if sp else ""
        out.append(f"- fewshot: hit rate {on.hit / on.hit_max:.1%} of the maximum (target >= 95%){tail}")
    if sp := speedups(rows, "agent"):
        on = first[("agent", "on")]
        out.append(f"- agent: cache on is {sp} faster than off;"
                   f" hit rate {on.hit / on.hit_max:.1%} of the maximum")  # fmt: skip
    if ("n8", "on") in first:
        on = first[("n8", "on")]
        out.append(f"- n8: peak active KV blocks {on.peak_active} vs {on.unshared_peak} for 8 unshared copies"
                   f" = {on.peak_active / on.unshared_peak:.1%} (target <= 45%)")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="chat,agent,n8,fewshot")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens per request (the issue's 64)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--num-blocks", type=int, default=2048)
    ap.add_argument("--scale", type=float, default=1.0, help="prompt lengths x this (tiny runs)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="on/off pairs per workload, run alternately; speedups are medians",
    )
    ap.add_argument("--write", default=None, help="also write the report (markdown) to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model()
    rows = []
    for name in args.workloads.split(","):
        # NOTE: on and off alternate, so load from other processes drifts over both sides of a pair.
        for run in range(1, args.repeat + 1):
            for caching in (True, False):
                row = run_one(lm, name, caching, args)
                row.run = run
                rows.append(row)
                print(f"{name} cache={row.cache} run {run}: {row.wall_s:.1f}s", file=sys.stderr, flush=True)
    cmd = "$ .venv/bin/python bench/workloads.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = (
        f"{cmd}\n\nmachine: {platform.machine()}, {torch.get_num_threads()} torch thread(s), CPU fp32, "
        f"SmolLM2-135M, block size 16, {args.num_blocks} blocks, {args.gen} generated tokens per request\n\n"
        f"{table(rows)}\n\n{summary(rows)}\n"
    )
    print(report)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
