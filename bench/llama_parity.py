"""Greedy tokens of radixd beside llama.cpp's on the same GGUF and the same prompt tokens.

For each model (`--models`, default the embedded one) and each radixd mode (`--dtypes`), the prompts'
greedy continuations from radixd's runner against llama-server's `/completion` (temperature 0, the
prompt given as token ids, no prompt cache): how many continuations are identical, and the mean
length of the common prefix. Quantized files run differently on the two sides (llama.cpp's own
kernels and activation rounding), so long continuations may part where two tokens are nearly tied.

    .venv/bin/python bench/llama_parity.py --llama-server DIR/llama.cpp/build/bin/llama-server \\
        --models DIR/gemma-3-270m-q4_k_m.gguf --out docs/measurements/bench-llama-parity.md
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
from benchkit import ModelRunner, StepSeq, default_model_path, load_model, write_report
from llama_server import LlamaServer, post, require_binary

CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers.",
]
TEXT = [
    "The quick brown fox",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
]
BLOCK = 16


def greedy(runner: ModelRunner, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `ids` through the paged pool (one prefill, then one token a step)."""
    table = list(range(1, runner.num_blocks))
    out: list[int] = []
    logits = runner.step_logits([StepSeq(0, ids, 0, table, None)])[-1]
    for pos in range(len(ids), len(ids) + n):
        out.append(int(torch.argmax(logits)))
        if len(out) == n:
            break
        logits = runner.step_logits([StepSeq(0, [out[-1]], pos, table, None)])[-1]
    return out


def common(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    ap.add_argument("--models", default="", help="GGUF files, comma-separated (default: the embedded model)")
    ap.add_argument("--dtypes", default="auto,float32", help="radixd modes, comma-separated")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the markdown report here")
    args = ap.parse_args(argv)
    require_binary(args.llama_server)
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m] or [default_model_path()]
    lines = [
        f"# Greedy tokens beside llama.cpp ({datetime.date.today()})",
        "",
        f"`python bench/llama_parity.py {' '.join(argv)}`: {len(CHAT)} chat and {len(TEXT)} plain prompts, "
        f"{args.tokens} greedy tokens each, the same prompt ids on both sides.",
        "",
        "| model | radixd mode | identical continuations | mean common prefix (tokens) |",
        "| --- | --- | ---: | ---: |",
    ]
    for model in models:
        lms = {d: load_model(model, dtype=d) for d in args.dtypes.split(",")}
        tok = next(iter(lms.values())).tokenizer
        prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHAT] + [
            tok.encode(t) for t in TEXT
        ]
        server = LlamaServer(args.llama_server, args.threads, context=1024, model=model)
        try:
            url = server.ready()
            theirs = []
            for ids in prompts:
                body = {"prompt": ids, "n_predict": args.tokens, "temperature": 0, "cache_prompt": False}
                got = post(url, {**body, "n_probs": 1, "top_k": 1})
                theirs.append([int(p["id"]) for p in got["completion_probabilities"]])
        finally:
            server.close()
        for lm in lms.values():
            blocks = (max(len(p) for p in prompts) + args.tokens) // BLOCK + 2
            runner = ModelRunner(lm.model, blocks, BLOCK)
            ours = [greedy(runner, ids, args.tokens) for ids in prompts]
            same = sum(a == b for a, b in zip(ours, theirs, strict=True))
            prefix = sum(common(a, b) for a, b in zip(ours, theirs, strict=True)) / len(prompts)
            name = Path(model).name
            lines.append(f"| {name} | {lm.model.precision.name} | {same} / {len(prompts)} | {prefix:.1f} |")
            print(lines[-1], flush=True)
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
