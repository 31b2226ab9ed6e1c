"""Speculative decoding (`--speculative-tokens`) through the engine, on against off, beside llama-server.

Two traces, each at every batch size of `--batches` (default 1,8: one request at a time, then eight
at once):
- repetitive (an agent's): a ~400-token file rewritten with a small change, a tool output quoted
  back, a second turn restating the first;
- non-repetitive: short chat questions answered in prose, each answer ending where the model ends it
  (the repetitive trace ignores EOS to rewrite whole files; a chat answer run past its end would
  start repeating itself, which drafts would then find).

Per round, speculation on and off alternate (which goes first alternates too) so background load drifts
hit both alike; medians over `--rounds`. The prefix cache is flushed before every run, so drafts come
from each request's own context, not from a previous round's answer in the tree. Every greedy output
with speculation on is asserted equal to the output with it off, token for token.

Decode tokens/s: tokens after each request's first, over the time from the first first-token to the
last output (prefill excluded). Drafting cost: the engine thread's time in `Speculator.plan` (finding
drafts, cutting them to a grammar, appending their slots) per step that looked for drafts, and its
share of the run's wall time, per case (speculation on only). With `--llama-server PATH`: llama-server
at batch 1 on the same prompt tokens, `--spec-type none` against `ngram-simple` (its prompt-lookup
n-grams), its own timings.

    PYTHONPATH=DIR:DIR/clients .venv/bin/python bench/speculative.py --rounds 3 --batches 1,8 \\
        --llama-server DIR/llama/build/bin/llama-server
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from dataclasses import dataclass

import torch
from llama_server import LlamaServer, post
from structured import Timed, run

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel, load_model

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
MAX_TOKENS = 128  # per request (`--max-tokens`)


def prompts(lm: LoadedModel, trace: str, n: int) -> list[list[int]]:
    """`n` prompts of `trace`, the trace's texts in turn."""
    if trace == "repetitive":
        return [lm.tokenizer.encode(REPETITIVE[i % len(REPETITIVE)]) for i in range(n)]
    return [lm.tokenizer.encode_chat([{"role": "user", "content": CHAT[i % len(CHAT)]}]) for i in range(n)]


def trace_size(trace: str, batch: int) -> int:
    """Requests per run: at batch 1 each text once (the repetitive trace's 3, 4 chat questions)."""
    return batch if batch > 1 else (len(REPETITIVE) if trace == "repetitive" else 4)


@dataclass
class EngineRun:
    """One run of a trace through one engine."""

    tps: float  # decode tokens/s
    outputs: list[list[int]]
    draft_us_per_step: float  # engine-thread drafting time per step that looked for drafts
    draft_share: float  # drafting time over the run's wall time


def engine_run(
    core: EngineCore, ps: list[list[int]], tag: str, batch: int, max_tokens: int, trace: str
) -> EngineRun:
    """Decode tokens/s, outputs and drafting cost of `ps`, `batch` at a time, from a flushed prefix
    cache."""
    core.admin.flush("evict_unlocked")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=trace == "repetitive")
    tokens = 0
    elapsed = 0.0
    outs: list[list[int]] = []
    spec = core.speculator
    draft_s, draft_steps = spec.draft_s, spec.draft_steps
    t0 = time.perf_counter()
    for at in range(0, len(ps), batch):
        group = [GenerateRequest(f"{tag}-{at + i}", p, params) for i, p in enumerate(ps[at : at + batch])]
        res: Timed = run(core, group)
        tokens += sum(len(t) - 1 for t in res.tokens.values())
        elapsed += max(res.last.values()) - min(res.first.values())
        outs += [res.tokens[r.request_id] for r in group]
    wall = time.perf_counter() - t0
    spent, steps = spec.draft_s - draft_s, spec.draft_steps - draft_steps
    return EngineRun(tokens / elapsed, outs, spent / max(steps, 1) * 1e6, spent / wall)


def llama_tps(url: str, ps: list[list[int]], max_tokens: int, trace: str) -> float:
    """llama-server's decode tokens/s over `ps`, one at a time (its own timings)."""
    n = 0
    ms = 0.0
    for p in ps:
        body = {
            "prompt": p,
            "temperature": 0.0,
            "n_predict": max_tokens,
            "cache_prompt": False,
            "ignore_eos": trace == "repetitive",
        }
        t = post(url, body)
        n += int(t["timings"]["predicted_n"]) - 1
        ms += float(t["timings"]["predicted_ms"])
    return n / ms * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated (each trace at each)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--speculative-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and not kept")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary (optional)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(dtype=args.dtype)
    cores = {
        k: build_core(lm, EngineConfig(speculative_tokens=k), num_blocks=2048)
        for k in (0, args.speculative_tokens)
    }
    out: dict[str, list[float]] = collections.defaultdict(list)
    batches = [int(b) for b in args.batches.split(",")]
    if not batches or min(batches) < 1:
        ap.error(f"--batches wants positive batch sizes such as 1,8, got {args.batches!r}")
    cases = [(trace, b) for trace in ("repetitive", "chat") for b in batches]
    cost: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for rnd in range(-args.warmup, args.rounds):  # negative rounds warm up; not kept
        for trace, b in cases:
            ps = prompts(lm, trace, trace_size(trace, b))
            order = sorted(cores, reverse=rnd % 2 == 1)
            got: dict[int, list[list[int]]] = {}
            for k in order:
                r = engine_run(cores[k], ps, f"{trace}{b}-{rnd}-{k}", b, args.max_tokens, trace)
                got[k] = r.outputs
                if rnd >= 0:
                    out[f"{trace} b{b} spec={'on' if k else 'off'}"].append(r.tps)
                    if k:
                        cost[f"{trace} b{b}"].append((r.draft_us_per_step, r.draft_share))
                drafting = f", drafting {r.draft_us_per_step:.1f} us/step" if k else ""
                print(
                    f"round {rnd} {trace} b{b} spec={'on' if k else 'off'}: {r.tps:.2f} tok/s{drafting}",
                    flush=True,
                )
            assert got[0] == got[args.speculative_tokens], f"{trace} b{b}: speculation changed an output"
        print(f"round {rnd} done", flush=True)
    spec = cores[args.speculative_tokens].stats()
    if args.llama_server:
        for name, flags in (("off", ["--spec-type", "none"]), ("on", ["--spec-type", "ngram-simple"])):
            with LlamaServer(args.llama_server, args.threads, extra=flags) as url:
                for trace in ("repetitive", "chat"):
                    ps = prompts(lm, trace, trace_size(trace, 1))
                    llama_tps(url, ps[:1], args.max_tokens, trace)  # warm-up
                    for _ in range(max(args.rounds, 1)):
                        out[f"llama {trace} b1 spec={name}"].append(
                            llama_tps(url, ps, args.max_tokens, trace)
                        )
                        print(f"llama {trace} b1 spec={name}: {out[f'llama {trace} b1 spec={name}'][-1]:.2f}")
    med = {k: statistics.median(v) for k, v in out.items()}
    for k, v in sorted(med.items()):
        print(f"{k:36s} median {v:8.2f} tok/s   rounds {' '.join(f'{x:.2f}' for x in out[k])}")
    for trace, b in cases:
        on, off = med[f"{trace} b{b} spec=on"], med[f"{trace} b{b} spec=off"]
        us = statistics.median(c[0] for c in cost[f"{trace} b{b}"]) if cost else float("nan")
        share = statistics.median(c[1] for c in cost[f"{trace} b{b}"]) if cost else float("nan")
        print(
            f"radixd {trace} b{b}: on/off {on / off:.3f}x; drafting {us:.1f} us/step ({share:.2%} of the run)"
        )
    if args.llama_server:
        for trace in ("repetitive", "chat"):
            on, off = med[f"llama {trace} b1 spec=on"], med[f"llama {trace} b1 spec=off"]
            print(f"llama-server {trace} b1: on/off {on / off:.3f}x")
    print(
        f"drafted {spec.drafted_tokens} accepted {spec.accepted_draft_tokens} "
        f"({spec.accepted_draft_tokens / max(spec.drafted_tokens, 1):.0%}); drafting "
        f"{spec.draft_s / max(spec.steps, 1) * 1e6:.1f} us per step over {spec.steps} steps"
    )


if __name__ == "__main__":
    main()
