"""Interleaved in-process A/B of the quantized modes' lm_head (issue 26, item 2): `old` (int4: bf16
`F.linear`; int8: the bf16 GEMM over the dequantized int8 weights) against `q8` (int8 per 32 inputs
through the compiled kernel of daemon/model/q8.py, the new default), in one model per mode.

Each round, in rotating order:
- the lm_head alone at each of `--rows` (median of `--calls` calls, with the caches flushed by a 64 MB
  stream between calls, as the layers' weights flush them in a decode step), beside the per-row int8
  kernel torch ships (`torch._weight_int8pack_mm`, one scale per row) and a 64 MB fp32 `sum`, whose
  bandwidth gives the q8 head's floor (its bytes over that bandwidth);
- a whole decode step at each of `--batches` (tok/s of `--decode-tokens` greedy steps after an
  untimed prefill, bench/offline.py's `RadixdSide`), the model's lm_head swapped per design.
Reports medians over the rounds and the median of the per-round ratios.

    .venv/bin/python bench/lmhead_ab.py --modes int4,int8 --rounds 5 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline import RadixdSide, prompts

from radixd.daemon.loaders import load_model
from radixd.daemon.model.linear import Int8Linear, Linear, OutInLinear
from radixd.daemon.model.llama import LlamaModel
from radixd.daemon.model.q8 import Q8Linear

FLUSH = torch.ones(16 * 1024 * 1024)  # 64 MB, twice the L3 of the machines measured
STREAM = "stream 64 MB (sum)"


def old_head(model: LlamaModel) -> Linear:
    """The mode's lm_head before issue 26."""
    w = model._lm_head.weight
    return OutInLinear(w, None) if model.precision.name == "int4" else Int8Linear(w.float(), None, w.dtype)


def timed(fn: Callable[[], object], calls: int) -> float:
    """Median seconds of `calls` calls of `fn`, the caches flushed before each."""
    out = []
    for _ in range(calls):
        FLUSH.sum()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def head_cases(model: LlamaModel, rows: list[int]) -> dict[str, Callable[[], object]]:
    """name -> one call, for the lm_head alone."""
    new = model._lm_head
    assert isinstance(new, Q8Linear), type(new)
    old = old_head(model)
    w = new.weight.float()
    s_row = w.abs().amax(1).clamp_min(1e-12) / 127
    q_row = torch.round(w / s_row[:, None]).clamp_(-127, 127).to(torch.int8)
    s_row_b = s_row.to(model.dtype)
    cases: dict[str, Callable[[], object]] = {STREAM: FLUSH.sum}
    for m in rows:
        x = torch.randn(m, w.shape[1]).to(model.dtype)
        cases[f"{m} rows old"] = lambda x=x: old(x)
        cases[f"{m} rows q8"] = lambda x=x: new(x)
        cases[f"{m} rows int8pack-row"] = lambda x=x: torch._weight_int8pack_mm(x, q_row, s_row_b)
    return cases


def report(title: str, res: dict[str, list[float]], unit: str, ratio_of: dict[str, str]) -> None:
    print(f"\n| {title} | median {unit} | new / old (median of rounds) |\n|---|---:|---:|")
    for k, v in res.items():
        r = ""
        if k in ratio_of:
            r = f"{statistics.median(a / b for a, b in zip(v, res[ratio_of[k]], strict=True)):.2f}x"
        print(f"| {k} | {statistics.median(v):.2f} | {r} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="int4,int8")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--calls", type=int, default=7, help="lm_head calls per case and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [int(m) for m in args.rows.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
    for mode in args.modes.split(","):
        lm = load_model(dtype=mode)
        model = lm.model
        heads = {"old": old_head(model), "q8": model._lm_head}
        cases = head_cases(model, rows)
        side = RadixdSide(lm, max(batches), args.prompt_len + args.decode_tokens + 1)
        head_ms: dict[str, list[float]] = {k: [] for k in cases}
        tps: dict[str, list[float]] = {f"decode b{b} {d}": [] for b in batches for d in heads}
        with torch.inference_mode():
            for r in range(args.rounds):
                names = list(cases)
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    head_ms[name].append(timed(cases[name], args.calls) * 1e3)
                designs = list(heads)
                for b in batches:
                    for d in designs[r % 2 :] + designs[: r % 2]:
                        model._lm_head = heads[d]
                        secs = side.decode(
                            prompts(b, args.prompt_len, model.config.vocab_size), args.decode_tokens
                        )[0]
                        tps[f"decode b{b} {d}"].append(b * args.decode_tokens / secs)
                model._lm_head = heads["q8"]
                last = {k: v[-1] for k, v in (head_ms | tps).items()}
                line = "; ".join(f"{k} {v:.2f}" for k, v in last.items())
                print(f"{mode} round {r + 1}: {line}", flush=True)
        q8 = model._lm_head
        assert isinstance(q8, Q8Linear)
        mb = (q8.q.numel() + q8.scale.numel() * 4) / 1e6
        bw = FLUSH.numel() * 4 / 1e6 / statistics.median(head_ms[STREAM])  # GB/s
        bf16_mb = q8.weight.numel() * 2 / 1e6
        print(f"\n{mode}: the q8 head streams {mb:.1f} MB a call (bf16: {bf16_mb:.1f} MB);")
        print(f"streamed {bw:.1f} GB/s: its floor {mb / bw:.1f} ms")
        report(f"{mode} lm_head alone", head_ms, "ms", {f"{m} rows q8": f"{m} rows old" for m in rows})
        report(f"{mode} decode step", tps, "tok/s", {f"decode b{b} q8": f"decode b{b} old" for b in batches})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
