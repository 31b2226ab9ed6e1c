"""Interleaved in-process A/B of the projections' designs for issue 25 (docs/batch-invariance-cost.md).

One model per mode is loaded once; its projections are swapped between designs before every
measurement, in rotating order within each round, so that the load other processes put on the CPU
hits every design alike. Measures decode tokens/s at each batch (after an untimed prefill, as
bench/offline.py does, through the same `RadixdSide`) and prefill tokens/s of `--prefill-batch`
prompts of `--prefill-len` tokens in steps of at most 512 tokens. Reports medians over the rounds
and, per design, the median over rounds of its ratio to `old` (today's kernels before issue 25).

Designs:
- float32: `old` = `x @ W` through MKL for every row count (no plan: rows of 1-11 take other
  kernels); `compiled` = the compiled kernel of daemon/model/f32.py (the default where it builds),
  over the GGUF's Q4_1 / Q8_0 blocks where the weights have them; `compiled-f32` = the same kernel
  over the fp32 weights;
  `onednn` = oneDNN's inner product over weights packed once at load (its fallback); `mkl-pad` =
  MKL's `x @ W` with calls of fewer rows than its probed floor padded up to it.
- int4: `old` = the int4 kernel up to 12 rows and the bf16 GEMM above; `kernel` = the int4 kernel for
  every row count (the new default); `gemm` = the bf16 GEMM over the dequantized weights always.

    .venv/bin/python bench/projections_ab.py --mode float32 --rounds 5 --threads 2

`--projections-only` times just the projections of one forward (every layer's four and the lm_head) at
each row count of `--rows` instead: what the designs change, at a fraction of the cost (the whole-model
measurement did not finish one round in 30 minutes on the loaded 2-core machine of issue 25).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline import RadixdSide, prompts

from radixd.daemon.loaders import load_model
from radixd.daemon.model.f32 import F32Linear
from radixd.daemon.model.int4 import Int4Linear
from radixd.daemon.model.linear import InOutLinear, Linear, OutInLinear, PackedLinear
from radixd.daemon.model.llama import LlamaModel, _LayerOps


class OldMm:
    """fp32 before issue 25: `x @ W` over an [in, out] copy, whatever the row count."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.w = w_out_in.t().contiguous()
        self.weight, self.bias = w_out_in, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w) if self.bias is None else torch.addmm(self.bias, x, self.w)


class OldInt4:
    """int4 before issue 25: the packed kernel up to 12 rows, the bf16 GEMM above."""

    def __init__(self, lin: Int4Linear) -> None:
        self.lin, self.weight, self.bias = lin, lin.weight, lin.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 12:
            return F.linear(x, self.weight, self.bias)
        return self.lin._kernel(x)


class OldLinear:
    """F.linear without a plan (the bf16 lm_head before issue 25)."""

    def __init__(self, lin: Linear) -> None:
        self.weight, self.bias = lin.weight, lin.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


Design = tuple[list[_LayerOps], Linear]


def designs(model: LlamaModel) -> dict[str, Design]:
    """The designs of `model`'s mode, each as (layers' projections, lm_head)."""
    own = (list(model._ops), model._lm_head)

    def each(make: Callable[[torch.Tensor, torch.Tensor | None], Linear]) -> list[_LayerOps]:
        return [
            _LayerOps(
                *(make(o.weight.float().contiguous(), o.bias) for o in (m.qkv, m.o_proj, m.gate_up, m.down))
            )
            for m in model._ops
        ]

    if model.precision.name == "float32":
        head = model._lm_head
        fp32_weights = functools.partial(F32Linear, gguf_blocks=False)
        return {
            "old": (each(OldMm), OldMm(head.weight, None)),
            "compiled": own,
            "compiled-f32": (each(fp32_weights), fp32_weights(head.weight, None)),
            "onednn": (each(PackedLinear), PackedLinear(head.weight, None)),
            "mkl-pad": (each(InOutLinear), InOutLinear(head.weight, None)),
        }

    def int4(wrap: type[OldInt4] | type[OutInLinear]) -> list[_LayerOps]:
        def one(o: Linear) -> Linear:
            assert isinstance(o, Int4Linear)
            return OldInt4(o) if wrap is OldInt4 else OutInLinear(o.weight, o.bias)

        return [_LayerOps(one(m.qkv), one(m.o_proj), one(m.gate_up), one(m.down)) for m in model._ops]

    return {
        "old": (int4(OldInt4), OldLinear(model._lm_head)),
        "kernel": own,
        "gemm": (int4(OutInLinear), model._lm_head),
    }


def projections_only(model: LlamaModel, ds: dict[str, Design], rows: list[int], rounds: int) -> None:
    """Median seconds of one pass over every projection at each row count (the lm_head at most 8 rows
    above 64: it sees one row per sampled sequence), designs interleaved."""
    dt, hidden = model.dtype, model.config.hidden_size
    xs = {(m, k): torch.randn(m, k).to(dt) for m in rows for k in (hidden, model.config.intermediate_size)}
    secs: dict[tuple[int, str], list[float]] = {(m, d): [] for m in rows for d in ds}
    with torch.inference_mode():
        for r in range(rounds):
            names = list(ds)
            names = names[r % len(names) :] + names[: r % len(names)]
            for m in rows:
                for name in names:
                    ops, head = ds[name]
                    t0 = time.perf_counter()
                    for lo in ops:
                        for o in (lo.qkv, lo.o_proj, lo.gate_up, lo.down):
                            o(xs[(m, o.weight.shape[1])])
                    head(xs[(min(m, 8) if m > 64 else m, hidden)])
                    secs[(m, name)].append(time.perf_counter() - t0)
            print(f"round {r + 1} done", flush=True)
    print(
        f"\n| {model.precision.name} projections, ms (median of {rounds}) | "
        + " | ".join(ds)
        + " | "
        + " | ".join(f"{d} speed / old" for d in ds if d != "old")
        + " |"
    )
    print("|---" * (2 * len(ds)) + "|")
    for m in rows:
        med = {d: statistics.median(secs[(m, d)]) * 1e3 for d in ds}
        ratios = [
            statistics.median(o / n for n, o in zip(secs[(m, d)], secs[(m, "old")], strict=True))
            for d in ds
            if d != "old"
        ]
        print(
            f"| {m} rows | "
            + " | ".join(f"{med[d]:.1f}" for d in ds)
            + " | "
            + " | ".join(f"{x:.0%}" for x in ratios)
            + " |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="float32", help="float32 or int4")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens before the decode steps")
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--prefill-batch", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--projections-only", action="store_true", help="time the projections alone")
    ap.add_argument("--rows", default="1,8,64,512", help="row counts of --projections-only")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    lm = load_model(dtype=args.mode)
    model = lm.model
    ds = designs(model)
    if args.projections_only:
        projections_only(model, ds, [int(m) for m in args.rows.split(",")], args.rounds)
        return 0
    max_len = max(args.prompt_len + args.decode_tokens, args.prefill_len) + 1
    side = RadixdSide(lm, max(max(batches), args.prefill_batch), max_len)
    vocab = model.config.vocab_size
    cases = [f"decode b{b}" for b in batches] + ["prefill"]
    tps: dict[tuple[str, str], list[float]] = {(c, d): [] for c in cases for d in ds}
    for r in range(args.rounds):
        names = list(ds)
        names = names[r % len(names) :] + names[: r % len(names)]
        for case in cases:
            for name in names:
                model._ops, model._lm_head = ds[name]
                if case == "prefill":
                    ps = prompts(args.prefill_batch, args.prefill_len, vocab)
                    secs = side.prefill(ps)[0]
                    tps[(case, name)].append(sum(map(len, ps)) / secs)
                else:
                    b = int(case.removeprefix("decode b"))
                    secs = side.decode(prompts(b, args.prompt_len, vocab), args.decode_tokens)[0]
                    tps[(case, name)].append(b * args.decode_tokens / secs)
        row = "; ".join(f"{c} " + " ".join(f"{d}={tps[(c, d)][-1]:.1f}" for d in ds) for c in cases)
        print(f"round {r + 1}: {row}", flush=True)
    print(
        f"\n| {args.mode} tok/s (median of {args.rounds}) | "
        + " | ".join(ds)
        + " | "
        + " | ".join(f"{d} / old" for d in ds if d != "old")
        + " |"
    )
    print("|---" * (2 * len(ds)) + "|")
    for c in cases:
        med = {d: statistics.median(tps[(c, d)]) for d in ds}
        ratios = [
            statistics.median(n / o for n, o in zip(tps[(c, d)], tps[(c, "old")], strict=True))
            for d in ds
            if d != "old"
        ]
        print(
            f"| {c} | "
            + " | ".join(f"{med[d]:.1f}" for d in ds)
            + " | "
            + " | ".join(f"{x:.0%}" for x in ratios)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
