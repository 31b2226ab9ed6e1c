"""Offline (in-process) throughput of radixd's ModelRunner per `--dtype` mode, beside llama.cpp's
`llama-batched-bench` on the same GGUF, batches, prompt length and thread count, in one run.

Measures, for every mode (`--dtypes`):
- decode tokens/s at each batch size (decode steps only: prompts are prefilled untimed first; the
  same definition as llama-batched-bench's S_TG), and the CPU busy share of the batch-8 decode;
- prefill tokens/s of `--prefill-batch` prompts of `--prompt-len` tokens, in steps of at most 512
  tokens (the engine's default step budget; llama-batched-bench's S_PP at the same batch);
- the batch-1 weight-streaming floor: one pass of every projection at one row, nothing else; and
  beside it what streaming their bytes costs this machine: those bytes read once by a plain sum;
- the quality contract against fp32 (mean KL, top-1 agreement, perplexity on the fixed text).

Every repeat runs every radixd mode and then llama-batched-bench, so background load drifts hit all
sides alike; medians over the repeats are reported. `--plot PNG` draws decode tok/s against batch.

    .venv/bin/python bench/offline.py --threads 2 \\
        --llama-batched-bench DIR/llama.cpp/build/bin/llama-batched-bench \\
        --plot docs/measurements/bench-offline.png
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from benchkit import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_KV_CACHE_GB,
    ENV_DECODER,
    LoadedModel,
    ModelRunner,
    QualityReport,
    SampleResult,
    SamplingParams,
    SamplingState,
    StepResult,
    StepSeq,
    default_model_path,
    load_model,
    num_blocks_for_budget,
    reference_log_probs,
    teacher_forced_quality,
)

QUALITY_TEXT = Path(__file__).resolve().parent.parent / "tests" / "daemon" / "data" / "quality_text.md"
STEP_TOKENS = 512


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def weight_stream_time(lm: LoadedModel, repeats: int) -> float:
    """Seconds for one pass of every projection at one row in the mode's own kernels (no attention,
    no norms): the weight-streaming floor of a batch-1 decode step in that mode on this CPU."""
    ops = lm.model.projections()

    def inputs(op: Any) -> int:  # float rows [out, in], or a GGUF's stored parts
        w = op.weight
        return int(w[0].cols if isinstance(w, tuple) else w.shape[1])

    xs = {inputs(op): torch.randn(1, inputs(op), dtype=lm.model.dtype) for op in ops}

    def run() -> None:
        for op in ops:
            op(xs[inputs(op)])

    run()
    return median_time(run, max(repeats, 5))


def step_bytes(lm: LoadedModel) -> int:
    """Bytes of every projection's operands (weights or codes, scales, minimums): what a batch-1 decode
    step must read from memory at least once."""
    total = 0
    for op in lm.model.projections():
        gemm = getattr(op, "gemm", None)
        if gemm is None:  # torch-run modes: the tensors the projection holds
            total += sum(t.nbytes for t in vars(op).values() if isinstance(t, torch.Tensor))
        while gemm is not None:
            total += sum(t.nbytes for t in gemm.operands)
            gemm = gemm.then
    return total


def read_time(nbytes: int, repeats: int) -> float:
    """Seconds to read `nbytes` once (a sum over them on torch's threads, no other arithmetic): what
    streaming that many bytes costs this machine (kernels that overlap loads with arithmetic may
    stream a little faster than this plain loop)."""
    buf = torch.ones(max(nbytes // 8, 1), dtype=torch.int64)
    buf.sum()
    return median_time(buf.sum, max(repeats, 9))


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    # Avoid the first ids (control tokens) so prompts look like text to the model.
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(batch)]


def one_token(r: StepResult) -> int:
    """The token of a step result without a draft (this bench drafts none): one sample."""
    if not isinstance(r, SampleResult):
        raise TypeError(f"expected one sample, got {r!r}")
    return r.token_id


class RadixdSide:
    """One mode's model and KV pool, driven through `ModelRunner.step` as the engine drives it."""

    def __init__(
        self,
        lm: LoadedModel,
        max_batch: int,
        max_len: int,
        block_size: int,
        scattered: bool,
        layout: list[int] | None = None,
    ) -> None:
        """`scattered`: the pool as large as the daemon's default KV budget, and each sequence's blocks
        drawn at random from all of it (a pool after churn); else a pool just large enough, each
        sequence's blocks in consecutive ids (one conversation on a fresh pool). `layout`: the pool of
        the default budget, and the first sequence's blocks these ids (a table that
        bench/block_layout.py wrote), the other sequences' the remaining ids in order."""
        self.lm = lm
        self.per_seq = -(-max_len // block_size)
        need = max_batch * self.per_seq + 1
        if scattered or layout is not None:
            budget = int(DEFAULT_KV_CACHE_GB * (1 << 30))
            need = max(need, num_blocks_for_budget(lm.config, block_size, budget, lm.model.kv_dtype))
        self.runner = ModelRunner(lm.model, num_blocks=need, block_size=block_size)
        self.ids = list(range(1, need))  # block 0 is the null block
        if scattered:
            random.Random(0).shuffle(self.ids)
        if layout is not None:
            if (
                len(layout) < self.per_seq
                or len(set(layout)) != len(layout)
                or not all(0 < b < need for b in layout)
            ):
                raise SystemExit(
                    f"--layout: need {self.per_seq} distinct ids in 1..{need - 1}, got {len(layout)} ids"
                )
            taken = set(layout)
            self.ids = layout + [b for b in self.ids if b not in taken]

    def _tables(self, batch: int) -> list[list[int]]:
        return [self.ids[i * self.per_seq : (i + 1) * self.per_seq] for i in range(batch)]

    def prefill(self, ps: list[list[int]]) -> tuple[float, list[int], list[SamplingState]]:
        """Prefill `ps` in steps of at most STEP_TOKENS tokens; -> (seconds, first tokens, states)."""
        tables = self._tables(len(ps))
        states = [SamplingState(SamplingParams(temperature=0.0)) for _ in ps]
        first: list[int] = [0] * len(ps)
        t0 = time.perf_counter()
        done = [0] * len(ps)
        while any(d < len(p) for d, p in zip(done, ps, strict=True)):
            budget = STEP_TOKENS
            step: list[tuple[int, StepSeq]] = []
            for i, p in enumerate(ps):
                if done[i] == len(p) or budget == 0:
                    continue
                n = min(len(p) - done[i], budget)
                last = done[i] + n == len(p)
                step.append(
                    (i, StepSeq(i, p[done[i] : done[i] + n], done[i], tables[i], states[i] if last else None))
                )
                done[i] += n
                budget -= n
            for (i, _), r in zip(step, self.runner.step([s for _, s in step]), strict=True):
                if r is not None:
                    first[i] = one_token(r)
        return time.perf_counter() - t0, first, states

    def decode(self, ps: list[list[int]], n: int) -> tuple[float, float]:
        """Prefill (untimed), then n greedy decode steps; -> (seconds, CPU seconds of this process)."""
        _, last, states = self.prefill(ps)
        tables = self._tables(len(ps))
        c0, t0 = time.process_time(), time.perf_counter()
        for k in range(n):
            pos = len(ps[0]) + k
            res = self.runner.step([StepSeq(i, [last[i]], pos, tables[i], states[i]) for i in range(len(ps))])
            last = [one_token(r) for r in res if r is not None]
        return time.perf_counter() - t0, time.process_time() - c0


@dataclass
class LlamaRow:
    s_pp: list[float] = field(default_factory=list)
    s_tg: list[float] = field(default_factory=list)


def run_llama(binary: str, model: str, args: argparse.Namespace, batches: list[int]) -> dict[int, LlamaRow]:
    """One llama-batched-bench run; -> batch -> (S_PP, S_TG) in tokens/s."""
    npl = sorted(set(batches) | {args.prefill_batch})
    cmd = [binary, "-m", model, "-npp", str(args.prompt_len), "-ntg", str(args.decode_tokens)]
    cmd += ["-npl", ",".join(map(str, npl)), "-t", str(args.threads or torch.get_num_threads())]
    cmd += ["-c", str(max(npl) * (args.prompt_len + args.decode_tokens) + 64)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    rows: dict[int, LlamaRow] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[2]):
            rows[int(cells[2])] = LlamaRow([float(cells[5])], [float(cells[7])])
    if not set(npl) <= set(rows):
        raise RuntimeError(f"llama-batched-bench printed no rows for batches {sorted(set(npl) - set(rows))}")
    return rows


@dataclass
class ModeResult:
    decode: dict[int, list[float]] = field(default_factory=dict)  # batch -> tok/s per repeat
    busy: list[float] = field(default_factory=list)  # batch-8 CPU busy share per repeat
    prefill: list[float] = field(default_factory=list)  # tok/s per repeat
    floor_s: float = 0.0
    read_s: float = 0.0  # a plain read of the step's bytes
    step_bytes: int = 0
    load_s: float = 0.0
    quality: QualityReport | None = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument(
        "--dtypes",
        default="float32,bfloat16,int8,int4",
        help="radixd modes (--dtype names); MODE@DECODER also sets RADIXD_CPU_DECODER for that side "
        "(float32,float32@torch: the compiled float32 step beside the layer-by-layer one)",
    )
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV block")
    ap.add_argument(
        "--scattered",
        action="store_true",
        help="each sequence's blocks at random over a pool of the default KV budget (a pool after churn)",
    )
    ap.add_argument(
        "--layout",
        type=Path,
        default=None,
        help="the first sequence's block ids, one a line (bench/block_layout.py --tables), in a pool of "
        "the default KV budget",
    )
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--decode-tokens", type=int, default=32, help="timed decode steps per measurement")
    ap.add_argument("--prefill-batch", type=int, default=8, help="prompts in the prefill measurement")
    ap.add_argument("--repeats", type=int, default=3, help="medians over this many runs")
    ap.add_argument("--threads", type=int, default=None, help="threads on every side (default: torch's)")
    ap.add_argument("--llama-batched-bench", metavar="PATH", help="llama.cpp's llama-batched-bench binary")
    ap.add_argument("--no-quality", action="store_true", help="skip the quality-contract measurement")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    ap.add_argument("--plot", default=None, help="draw decode tok/s against batch into this PNG")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["RADIXD_NUM_THREADS"] = str(args.threads)
    started = datetime.datetime.now(datetime.UTC)
    batches = [int(b) for b in args.batches.split(",")]
    modes = args.dtypes.split(",")
    path = args.model or default_model_path()
    max_len = args.prompt_len + args.decode_tokens + 1
    sides: dict[str, RadixdSide] = {}
    results: dict[str, ModeResult] = {}
    caller_decoder = os.environ.get(ENV_DECODER)
    for mode in modes:
        dtype, _, decoder = mode.partition("@")
        os.environ[ENV_DECODER] = decoder or caller_decoder or "auto"  # read when the model is built
        t0 = time.perf_counter()
        lm = load_model(path, dtype=dtype)
        results[mode] = ModeResult(load_s=time.perf_counter() - t0)
        # the warm-up below decodes 2 sequences
        most = max(max(batches), args.prefill_batch, 2)
        layout = [int(x) for x in args.layout.read_text().split()] if args.layout is not None else None
        sides[mode] = RadixdSide(lm, most, max_len, args.block_size, args.scattered, layout)
    if caller_decoder is None:
        os.environ.pop(ENV_DECODER)
    else:
        os.environ[ENV_DECODER] = caller_decoder
    llama: dict[int, LlamaRow] = {}
    threads = torch.get_num_threads()
    with torch.inference_mode():
        for side in sides.values():  # warm-up: first calls allocate and pick kernels
            side.decode(prompts(2, args.prompt_len, side.lm.config.vocab_size), 2)
        for rep in range(args.repeats):
            for b in batches:
                ps = prompts(b, args.prompt_len, sides[modes[0]].lm.config.vocab_size)
                for mode, side in sides.items():
                    wall, cpu = side.decode(ps, args.decode_tokens)
                    results[mode].decode.setdefault(b, []).append(b * args.decode_tokens / wall)
                    if b == 8:
                        results[mode].busy.append(cpu / (wall * threads))
            pp = prompts(args.prefill_batch, args.prompt_len, sides[modes[0]].lm.config.vocab_size)
            for mode, side in sides.items():
                results[mode].prefill.append(args.prefill_batch * args.prompt_len / side.prefill(pp)[0])
            if args.llama_batched_bench:
                for b, row in run_llama(args.llama_batched_bench, path, args, batches).items():
                    agg = llama.setdefault(b, LlamaRow())
                    agg.s_pp += row.s_pp
                    agg.s_tg += row.s_tg
            print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
        for mode, side in sides.items():
            results[mode].floor_s = weight_stream_time(side.lm, args.repeats)
            results[mode].step_bytes = step_bytes(side.lm)
            results[mode].read_s = read_time(results[mode].step_bytes, args.repeats)
        if not args.no_quality and "float32" in sides:
            ids = sides["float32"].lm.tokenizer.encode(QUALITY_TEXT.read_text())
            ref = reference_log_probs(ModelRunner(sides["float32"].lm.model, len(ids) // 16 + 2, 16), ids)
            for mode, side in sides.items():
                if mode != "float32":
                    own = ModelRunner(side.lm.model, len(ids) // 16 + 2, 16)
                    results[mode].quality = teacher_forced_quality(ref, own, ids)
    report = render(args, argv, path, started, results, llama, batches)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    if args.plot:
        plot(args.plot, results, llama, batches, args)
    return 0


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def render(
    args: argparse.Namespace,
    argv: list[str] | None,
    path: str,
    started: datetime.datetime,
    results: dict[str, ModeResult],
    llama: dict[int, LlamaRow],
    batches: list[int],
) -> str:
    cmd = " ".join([".venv/bin/python bench/offline.py", *(argv if argv is not None else sys.argv[1:])])
    load = os.getloadavg()
    head = " | ".join(f"radixd {m}" for m in results)
    lines = [
        f"Command: `{cmd}`",
        "",
        f"- run: {started:%Y-%m-%d %H:%M} UTC, {args.repeats} repeats (medians), load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
        f"- model: `{os.path.basename(path)}`; CPU: {platform.processor() or platform.machine()}, "
        f"threads {torch.get_num_threads()} on every side",
        f"- decode: {args.prompt_len}-token prompts, {args.decode_tokens} timed greedy steps; prefill: "
        f"{args.prefill_batch} x {args.prompt_len} tokens in steps of <= {STEP_TOKENS}",
        "",
    ]
    ratio_head = " | ".join(f"{m} / llama.cpp" for m in results) if llama else ""
    lines.append(f"| decode tok/s | {head} |" + (f" llama.cpp | {ratio_head} |" if llama else ""))
    n_cols = len(results) + (1 + len(results) if llama else 0)
    lines.append("| --- |" + " ---: |" * n_cols)
    for b in batches:
        ours = [_med(r.decode[b]) for r in results.values()]
        row = f"| batch {b} | " + " | ".join(f"{x:.1f}" for x in ours) + " |"
        if llama:
            theirs = _med(llama[b].s_tg)
            row += f" {theirs:.1f} | " + " | ".join(f"{x / theirs:.2f}x" for x in ours) + " |"
        lines.append(row)
    ours_pp = [_med(r.prefill) for r in results.values()]
    row = f"| prefill tok/s ({args.prefill_batch} x {args.prompt_len}) | " + " | ".join(
        f"{x:.0f}" for x in ours_pp
    )
    if llama:
        theirs = _med(llama[args.prefill_batch].s_pp)
        row += f" | {theirs:.0f} | " + " | ".join(f"{x / theirs:.2f}x" for x in ours_pp)
    lines += [row + " |", ""]
    lines += [
        "| mode | step bytes (MB) | read (ms) | batch-1 floor (ms) | batch-1 step (ms) | busy at batch 8 "
        "| load (s) | KL | top-1 | ppl |"
    ]
    lines += ["| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode, r in results.items():
        q = r.quality
        if q:
            qs = f"{q.mean_kl:.4f} | {100 * q.top1_agreement:.1f}% | {100 * q.ppl_change:+.2f}%"
        else:  # the reference itself, or quality not measured (--no-quality)
            qs = "0 (reference) | 100% | -" if mode == "float32" else "- | - | -"
        step = 1e3 / _med(r.decode[1]) if 1 in r.decode else float("nan")
        busy = f"{100 * _med(r.busy):.0f}%" if r.busy else "-"
        lines.append(
            f"| {mode} | {r.step_bytes / 1e6:.0f} | {r.read_s * 1e3:.1f} | {r.floor_s * 1e3:.1f} "
            f"| {step:.1f} | {busy} | {r.load_s:.1f} | {qs} |"
        )
    if llama:
        lines += [
            "",
            "llama.cpp per repeat (S_TG tok/s): "
            + "; ".join(f"batch {b}: " + ", ".join(f"{x:.0f}" for x in llama[b].s_tg) for b in batches),
        ]
    lines += [
        "radixd per repeat (decode tok/s): "
        + "; ".join(
            f"{m} batch {b}: " + ", ".join(f"{x:.0f}" for x in r.decode[b])
            for m, r in results.items()
            for b in batches
        ),
        "",
    ]
    return "\n".join(lines)


def plot(
    out: str,
    results: dict[str, ModeResult],
    llama: dict[int, LlamaRow],
    batches: list[int],
    args: argparse.Namespace,
) -> None:
    """Decode tok/s against batch size: one line per radixd mode, one for llama.cpp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for mode, r in results.items():
        ax.plot(batches, [_med(r.decode[b]) for b in batches], marker="o", label=f"radixd {mode}")
    if llama:
        ax.plot(
            batches, [_med(llama[b].s_tg) for b in batches], marker="s", ls="--", color="k", label="llama.cpp"
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size (sequences decoding together)")
    ax.set_ylabel("decode tokens/s")
    model = os.path.basename(args.model or default_model_path())
    ax.set_title(f"{model}, {torch.get_num_threads()} threads, {args.prompt_len}-token prompts", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    raise SystemExit(main())
