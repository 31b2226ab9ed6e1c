"""Speculative decoding through the engine: the default configuration (on, K = the daemon's default,
its draft budget) against `--speculative-tokens 0`, beside llama-server.

Two traces, the repetitive one at each batch size of `--batches`, chat at each of `--chat-batches`:
- repetitive (an agent's): a ~400-token file rewritten with a small change, a tool output quoted
  back, a second turn restating the first (EOS ignored, to rewrite whole files);
- chat: short questions answered in prose, each answer ending where the model ends it (run past its
  end, an answer would start repeating itself, which drafts would then find).

Per round, speculation on and off alternate (which goes first alternates too), medians over `--rounds`,
and the median of the rounds' own on / off ratios (each round's two runs share that moment's load).
Each engine keeps what it learned (step costs, acceptance) from run to run, as a daemon would.
`--policy cap` replaces the daemon's draft budget by a row cap (`RowCap`) to compare the two.
The prefix cache is flushed before every run, so drafts come from each request's own context. Every
greedy output with speculation on is asserted equal to the one with it off, token for token.

Decode tokens/s: tokens after each request's first, over the first first-token to the last output.
Drafting: the engine thread's time in `Speculator.plan` per step that looked for drafts, and its share
of the run's wall time (speculation on). With `--llama-server PATH`: llama-server at batch 1 on the
same prompt tokens, `--spec-type none` against `ngram-simple`, its own timings.

    python bench/speculative.py --rounds 3 --max-tokens 64 --batches 1,8 --chat-batches 1,8,32 \
        [--policy budget|cap] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchkit import EngineConfig, GenerateRequest, SamplingParams, engine_cores, run_requests
from llama_server import LlamaServer, post, require_binary

FILE = "\n".join(
    f"def rect_{i}(width, height):\n    # area of rectangle number {i}\n    return width * height + {i}\n"
    for i in range(16)
)
TOOL = "\n".join(
    f"{{'id': {i}, 'name': 'item-{i}', 'price': {3 * i + 1}.50, 'stock': {i % 7}}}" for i in range(12)
)
TURN1 = (
    "The lighthouse keeper climbed the stairs every evening at six, trimmed the wick, wound the clock "
    "that turned the lens, and wrote the weather in his logbook before the ships came past the reef."
)
REPETITIVE = [
    f"Here is the file utils.py:\n\n{FILE}\nRewrite the whole file, renaming rect_3 to square_3.\n\n"
    f"{FILE[:60]}",
    f"The tool returned:\n{TOOL}\nQuote the tool output exactly, then say which item is cheapest.\n\n"
    f"{TOOL[:40]}",
    f"User: Describe the keeper's evening.\nAssistant: {TURN1}\nUser: Say that again, word for word."
    f"\nAssistant: {TURN1[:50]}",
]
CHAT = [
    "Write a short poem about autumn leaves.",
    "Why is the sky blue? Explain simply.",
    "Give three tips for learning a new language.",
    "What makes a good cup of coffee?",
    "Describe a busy market in the morning.",
    "How do bees make honey?",
    "Tell me a story about a dragon who loves tea.",
    "What should I pack for a weekend hike?",
]
TRACES = ("repetitive", "chat")


class RowCap:
    """The other draft policy `--policy cap` measures (the daemon's is `DraftBudget`, the marginal
    one): a cap on a step's rows, the most rows whose learned step cost stays within `slack` times a
    one-row step's (the rows that ride the weights' stream), given to the most often accepted
    sequences first, each up to its adaptive k; no expected-tokens arithmetic."""

    def __init__(self, cost: Any, slack: float) -> None:
        self.cost = cost
        self.slack = slack
        self._room = 0

    def start(self, rows: int, tokens: int) -> None:
        one = self.cost(1)
        if one is None:
            self._room = 1 << 20  # nothing measured yet: draft, and the timings come
            return
        cap = rows
        while cap < 4096 and self.cost(cap + 1) <= self.slack * one:
            cap += 1
        self._room = cap - rows

    def rows_for(self, rate: float, most: int) -> int:
        return max(0, min(most, self._room))

    def take(self, rate: float, rows: int) -> None:
        self._room -= rows


def prompts(tokenizer: Any, trace: str, batch: int) -> list[list[int]]:
    """The prompts of one run: `batch` of them, or at batch 1 each text once (the repetitive trace's
    3, 4 chat questions)."""
    if trace == "repetitive":
        n = batch if batch > 1 else len(REPETITIVE)
        return [tokenizer.encode(REPETITIVE[i % len(REPETITIVE)]) for i in range(n)]
    n = batch if batch > 1 else 4
    return [tokenizer.encode_chat([{"role": "user", "content": CHAT[i % len(CHAT)]}]) for i in range(n)]


@dataclass
class EngineRun:
    """One run of a trace through one engine."""

    tps: float  # decode tokens/s
    outputs: list[list[int]]
    draft_us_per_step: float  # engine-thread drafting time per step that looked for drafts
    draft_share: float  # drafting time over the run's wall time
    drafted: int  # draft tokens verified
    accepted: int  # of those, accepted


def engine_run(
    core: Any, ps: list[list[int]], tag: str, batch: int, max_tokens: int, trace: str
) -> EngineRun:
    """`ps`, `batch` at a time, from a flushed prefix cache."""
    core.admin.flush("evict_unlocked")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=trace == "repetitive")
    tokens, elapsed = 0, 0.0
    outs: list[list[int]] = []
    spec = core.speculator
    draft_s, draft_steps = spec.draft_s, spec.draft_steps
    drafted, accepted = spec.drafted_tokens, spec.accepted_tokens
    t0 = time.perf_counter()
    for at in range(0, len(ps), batch):
        group = [GenerateRequest(f"{tag}-{at + i}", p, params) for i, p in enumerate(ps[at : at + batch])]
        res = run_requests(core, group)
        tokens += res.decode_tokens()
        elapsed += res.decode_s()
        outs += [res.tokens[r.request_id] for r in group]
    wall = time.perf_counter() - t0
    spent, steps = spec.draft_s - draft_s, spec.draft_steps - draft_steps
    return EngineRun(
        tokens / elapsed,
        outs,
        spent / max(steps, 1) * 1e6,
        spent / wall,
        spec.drafted_tokens - drafted,
        spec.accepted_tokens - accepted,
    )


def llama_tps(url: str, ps: list[list[int]], max_tokens: int, trace: str) -> float:
    """llama-server's decode tokens/s over `ps`, one at a time (its own timings)."""
    n, ms = 0, 0.0
    for p in ps:
        body = {"prompt": p, "temperature": 0.0, "n_predict": max_tokens, "cache_prompt": False}
        t = post(url, body | {"ignore_eos": trace == "repetitive"})["timings"]
        n += int(t["predicted_n"]) - 1
        ms += float(t["predicted_ms"])
    return n / ms * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and not kept")
    ap.add_argument("--batches", default="1,8", help="the repetitive trace's batch sizes, comma-separated")
    ap.add_argument("--chat-batches", default="1,8,32", help="the chat trace's batch sizes")
    ap.add_argument(
        "--traces", default=",".join(TRACES), help="comma-separated subset of " + ",".join(TRACES)
    )
    ap.add_argument("--max-tokens", type=int, default=64, help="per request")
    ap.add_argument(
        "--speculative-tokens", type=int, default=None, help="K when on (default: the daemon's default)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--policy",
        choices=("budget", "cap"),
        default="budget",
        help="draft policy when on: the daemon's budget, or a row cap (RowCap) to compare with",
    )
    ap.add_argument("--cap-slack", type=float, default=1.5, help="--policy cap: step cost over 1 row's")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary (optional)")
    args = ap.parse_args()
    lists = (args.batches, args.chat_batches)
    sizes = {t: [int(b) for b in arg.split(",")] for t, arg in zip(TRACES, lists, strict=True)}
    traces = args.traces.split(",")
    if min(min(b) for b in sizes.values()) < 1 or not set(traces) <= set(TRACES):
        ap.error(f"--batches wants positive sizes, --traces a subset of {','.join(TRACES)}")
    if args.llama_server:
        require_binary(args.llama_server)
    k_on = args.speculative_tokens or EngineConfig().speculative_tokens
    configs = {k: EngineConfig(speculative_tokens=k) for k in (0, k_on)}
    lm, cores = engine_cores(configs, args.dtype, args.threads, num_blocks=2048)
    if args.policy == "cap":
        spec = cores[k_on].speculator
        spec.budget = RowCap(spec.budget.cost, args.cap_slack)
    tps: dict[str, list[float]] = collections.defaultdict(list)
    cost: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    drafts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])  # (verified, accepted)
    cases = [(trace, b) for trace in traces for b in sizes[trace]]
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    for rnd in range(-args.warmup, args.rounds):  # negative rounds warm up; not kept
        for trace, b in cases:
            ps = prompts(lm.tokenizer, trace, b)
            got: dict[int, list[list[int]]] = {}
            for k in sorted(cores, reverse=rnd % 2 == 1):
                r = engine_run(cores[k], ps, f"{trace}{b}-{rnd}-{k}", b, args.max_tokens, trace)
                got[k] = r.outputs
                if rnd >= 0:
                    tps[f"{trace} b{b} {'on' if k else 'off'}"].append(r.tps)
                    if k:
                        cost[f"{trace} b{b}"].append((r.draft_us_per_step, r.draft_share))
                        drafts[f"{trace} b{b}"][0] += r.drafted
                        drafts[f"{trace} b{b}"][1] += r.accepted
            assert got[0] == got[k_on], f"{trace} b{b}: speculation changed an output"
            if rnd >= 0:  # the round's own ratio: both runs saw the machine's load of that moment
                ratios[f"{trace} b{b}"].append(tps[f"{trace} b{b} on"][-1] / tps[f"{trace} b{b} off"][-1])
        print(f"round {rnd} done", flush=True)
    if args.llama_server:
        for name, flags in (("off", ["--spec-type", "none"]), ("on", ["--spec-type", "ngram-simple"])):
            with LlamaServer(args.llama_server, args.threads, extra=flags) as url:
                for trace in traces:
                    ps = prompts(lm.tokenizer, trace, 1)
                    llama_tps(url, ps[:1], args.max_tokens, trace)  # warm-up
                    for _ in range(max(args.rounds, 1)):
                        tps[f"llama {trace} b1 {name}"].append(llama_tps(url, ps, args.max_tokens, trace))
    med = {k: statistics.median(v) for k, v in tps.items()}
    print(
        f"\nmedian decode tok/s over {args.rounds} rounds, K = {k_on}, policy {args.policy}, "
        f"{args.max_tokens} tokens a request\n"
    )
    print(
        "| engine | trace | batch | off | on | on / off | on / off per round (median, range) "
        "| drafting (µs/step) | drafting (share of run) | draft tokens verified (accepted) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for trace, b in cases:
        on, off = med[f"{trace} b{b} on"], med[f"{trace} b{b} off"]
        us = statistics.median(c[0] for c in cost[f"{trace} b{b}"])
        share = statistics.median(c[1] for c in cost[f"{trace} b{b}"])
        rs = ratios[f"{trace} b{b}"]
        spread = f"{statistics.median(rs):.3f}x ({min(rs):.2f}-{max(rs):.2f})"
        verified, accepted = drafts[f"{trace} b{b}"]
        cells = f"{off:.2f} | {on:.2f} | {on / off:.3f}x | {spread} | {us:.1f} | {share:.2%} | "
        cells += f"{verified} ({accepted / max(verified, 1):.0%})"
        print(f"| radixd | {trace} | {b} | {cells} |")
    if args.llama_server:
        for trace in traces:
            on, off = med[f"llama {trace} b1 on"], med[f"llama {trace} b1 off"]
            print(f"| llama-server | {trace} | 1 | {off:.2f} | {on:.2f} | {on / off:.3f}x | | | | |")
    st = cores[k_on].stats()
    print(
        f"\ndrafted {st.drafted_tokens}, accepted {st.accepted_draft_tokens} "
        f"({st.accepted_draft_tokens / max(st.drafted_tokens, 1):.0%}) over {st.steps} steps"
    )


if __name__ == "__main__":
    main()
