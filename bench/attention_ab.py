"""Whole-model A/B of the CPU attention designs (issues 25 and 26, item 3), interleaved in one process.

One model is loaded once and driven through bench/offline.py's ``RadixdSide`` (the engine's
``ModelRunner.step``). Before every measurement the attention is switched: ``compiled`` and ``split``
through ``RADIXD_CPU_ATTENTION`` (kernels/cpu_attention.py), ``baseline`` by swapping the model's
kernels package for ``--baseline-commit``'s (e.g. 0fcdfc1, before issue 25). Designs rotate within
each round, so load from other processes hits all alike. Reports decode tokens/s per (batch, prompt
length) after an untimed prefill (offline.py's definition), medians over rounds and the median of the
per-round ratios to ``baseline`` (or to ``split`` without one).

    .venv/bin/python bench/attention_ab.py --batches 1,8 --prompt-lens 128,1000 --rounds 3 \\
        --baseline-commit 0fcdfc1
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_cpu import load_baseline
from offline import RadixdSide, prompts

from radixd.daemon.loaders import load_model
from radixd.daemon.model import llama
from radixd.kernels import cpu_attention


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", help="the model's --dtype mode")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-lens", default="128", help="prompt tokens per sequence, comma-separated")
    ap.add_argument("--decode-tokens", type=int, default=8, help="timed decode steps per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--baseline-commit", default=None, help="also run this commit's kernels (e.g. 0fcdfc1)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    lens = [int(n) for n in args.prompt_lens.split(",")]
    lm = load_model(dtype=args.dtype)
    vocab = lm.model.config.vocab_size
    side = RadixdSide(lm, max(batches), max(lens) + args.decode_tokens + 1)
    today = llama.kernels
    designs: dict[str, object] = {"compiled": today, "split": today}
    if args.baseline_commit:
        base = load_baseline(args.baseline_commit)
        designs["baseline"] = importlib.import_module(base.__name__.rsplit(".", 1)[0])
    ref = "baseline" if "baseline" in designs else "split"
    cases = [(b, n) for n in lens for b in batches]
    tps: dict[tuple[str, int, int], list[float]] = {}
    names = list(designs)
    try:
        for name in names:  # warm-up: first-call costs (allocations, kernel builds) hit no timed round
            llama.kernels = designs[name]  # type: ignore[assignment]
            os.environ[cpu_attention.ENV_DESIGN] = "split" if name == "split" else "compiled"
            side.decode(prompts(1, 16, vocab), 2)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for b, n in cases:
                ps = prompts(b, n, vocab)
                for name in order:
                    llama.kernels = designs[name]  # type: ignore[assignment]
                    os.environ[cpu_attention.ENV_DESIGN] = "split" if name == "split" else "compiled"
                    secs = side.decode(ps, args.decode_tokens)[0]
                    tps.setdefault((name, b, n), []).append(b * args.decode_tokens / secs)
                    print(f"round {r} {name} b{b} prompt {n}: {tps[(name, b, n)][-1]:.1f} tok/s", flush=True)
    finally:
        llama.kernels = today
    lines = [
        f"{args.dtype}, {torch.get_num_threads()} threads, {args.decode_tokens} timed decode steps after an "
        f"untimed prefill, {args.rounds} interleaved rounds; decode tok/s (median) and median per-round "
        f"ratio to {ref}",
        "",
        "| batch | prompt | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{x} / {ref}" for x in names if x != ref)
        + " |",
        "| ---: | ---: |" + " ---: |" * (2 * len(names) - 1),
    ]
    for b, n in cases:
        meds = [f"{statistics.median(tps[(x, b, n)]):.1f}" for x in names]
        ratios = [
            f"{statistics.median(a / c for a, c in zip(tps[(x, b, n)], tps[(ref, b, n)], strict=True)):.2f}"
            for x in names
            if x != ref
        ]
        lines.append(f"| {b} | {n} | " + " | ".join(meds) + " | " + " | ".join(ratios) + " |")
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
