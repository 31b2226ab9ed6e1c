"""Offline (in-process) throughput: radixd's ModelRunner vs transformers' generate, same prompts, same run.

Measures, with the same torch thread count for both:
- decode tokens/s at batch 1, 8, 32, 64 (decode steps only: prefill is excluded on both sides; for
  transformers it is the time of generate(N+1 tokens) minus generate(1 token), divided by N);
- the time of one 512-token prefill;
- this CPU's fp32 matmul FLOP/s, and the compute ceiling FLOP/s / (2 x parameters per token).

    .venv/bin/python bench/offline.py --out docs/bench-offline.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from radixd.daemon.loaders import LoadedModel, default_model_path, load_model
from radixd.daemon.runner import ModelRunner, StepSeq
from radixd.daemon.sampling import SamplingParams, SamplingState


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_flops(repeats: int) -> float:
    """fp32 FLOP/s of a 1024^3 matmul (median of max(repeats, 5) runs)."""
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    return 2 * n**3 / median_time(lambda: a @ b, max(repeats, 5))


def weight_stream_time(lm: LoadedModel, repeats: int) -> float:
    """Seconds for one pass of every weight matrix at batch 1 (the matvecs alone, no attention): the
    memory-bandwidth floor of a batch-1 decode step for any fp32 implementation on this CPU."""
    w = lm.model.weights
    mats = [m for lw in w.layers for m in (lw.qkv, lw.o_proj, lw.gate_up, lw.down)] + [w.lm_head]
    xs = {n: torch.randn(1, n) for n in {m.shape[1] for m in mats}}

    def run() -> None:
        for m in mats:
            torch.nn.functional.linear(xs[m.shape[1]], m)

    run()
    return median_time(run, max(repeats, 5))


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    # Avoid the first ids (control tokens) so prompts look like text to both models.
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(batch)]


class RadixdSide:
    def __init__(self, lm: LoadedModel, max_batch: int, max_len: int, block_size: int = 16) -> None:
        per_seq = -(-max_len // block_size)
        self.bs = block_size
        self.per_seq = per_seq
        self.runner = ModelRunner(lm.model, num_blocks=max_batch * per_seq + 1, block_size=block_size)

    def _tables(self, batch: int) -> list[list[int]]:
        return [list(range(1 + i * self.per_seq, 1 + (i + 1) * self.per_seq)) for i in range(batch)]

    def decode(self, ps: list[list[int]], n: int) -> float:
        """Prefill (untimed), then time n greedy decode steps; returns seconds for the n steps."""
        tables = self._tables(len(ps))
        states = [SamplingState(SamplingParams(temperature=0.0, max_tokens=n + 1)) for _ in ps]
        res = self.runner.step([StepSeq(i, p, 0, tables[i], states[i]) for i, p in enumerate(ps)])
        last = [r.token_id for r in res if r is not None]
        t0 = time.perf_counter()
        for k in range(n):
            pos = len(ps[0]) + k
            res = self.runner.step([StepSeq(i, [last[i]], pos, tables[i], states[i]) for i in range(len(ps))])
            last = [r.token_id for r in res if r is not None]
        return time.perf_counter() - t0

    def prefill(self, p: list[int]) -> float:
        st = SamplingState(SamplingParams(temperature=0.0))
        t0 = time.perf_counter()
        self.runner.step([StepSeq(0, p, 0, self._tables(1)[0], st)])
        return time.perf_counter() - t0


class HFSide:
    def __init__(self, path: str) -> None:
        from transformers import AutoConfig, LlamaForCausalLM
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        cfg = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        build: Any = LlamaForCausalLM
        self.model: Any = build(cfg)
        self.model.eval()
        read_gguf: Any = load_gguf_checkpoint
        parsed = read_gguf(path, return_tensors=True, model_to_load=self.model)
        self.model.load_state_dict(parsed["tensors"], strict=False)
        self.model.tie_weights()
        self.model.generation_config.eos_token_id = None

    def generate(self, ps: list[list[int]], new: int) -> float:
        ids = torch.tensor(ps)
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, pad_token_id=0
            )
        return time.perf_counter() - t0

    def decode(self, ps: list[list[int]], n: int) -> float:
        return max(self.generate(ps, n + 1) - self.generate(ps, 1), 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded SmolLM2)")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt tokens before the timed decode")
    ap.add_argument("--decode-tokens", type=int, default=16, help="timed decode steps per measurement")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="medians over this many runs")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers side")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["RADIXD_NUM_THREADS"] = str(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    path = args.model or default_model_path()
    lm = load_model(path)
    cfg = lm.config
    flops_runs = [matmul_flops(args.repeats)]
    ours = RadixdSide(lm, max(batches), max(args.prompt_len + args.decode_tokens + 1, args.prefill_len + 1))
    hf = None if args.no_hf else HFSide(path)
    rows = []
    with torch.inference_mode():
        for b in batches:
            ps = prompts(b, args.prompt_len, cfg.vocab_size)
            n = args.decode_tokens
            ours.decode(ps, 2)  # warm-up
            if hf is not None:
                hf.decode(ps, 2)
            # NOTE: the two sides alternate within each repeat so background load hits both alike.
            t_ours, t_hf = [], []
            for _ in range(args.repeats):
                # The CPU's matmul rate is sampled between measurements too: background load drifts.
                flops_runs.append(matmul_flops(1))
                t_ours.append(ours.decode(ps, n))
                if hf is not None:
                    t_hf.append(hf.decode(ps, n))
            r_ours = b * n / statistics.median(t_ours)
            r_hf = b * n / statistics.median(t_hf) if t_hf else None
            rows.append((b, r_ours, r_hf))
            print(f"batch {b}: radixd {r_ours:.1f} tok/s, transformers {r_hf or 0:.1f} tok/s", flush=True)
        pp = prompts(1, args.prefill_len, cfg.vocab_size)[0]
        ours.prefill(pp)
        if hf is not None:
            hf.generate([pp], 1)
        p_ours, p_hf = [], []
        for _ in range(args.repeats):
            p_ours.append(ours.prefill(pp))
            if hf is not None:
                p_hf.append(hf.generate([pp], 1))
        pre_ours = statistics.median(p_ours)
        pre_hf = statistics.median(p_hf) if p_hf else None
        floor = weight_stream_time(lm, args.repeats)
    flops = statistics.median(flops_runs)
    ceiling = flops / (2 * cfg.num_params)
    report = render(args, argv, path, cfg.num_params, flops_runs, ceiling, rows, pre_ours, pre_hf, floor)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


def render(
    args: argparse.Namespace,
    argv: list[str] | None,
    path: str,
    params: int,
    flops_runs: list[float],
    ceiling: float,
    rows: list[tuple[int, float, float | None]],
    pre_ours: float,
    pre_hf: float | None,
    floor: float,
) -> str:
    cmd = " ".join([".venv/bin/python bench/offline.py", *(argv if argv is not None else sys.argv[1:])])
    load = os.getloadavg()
    flops = statistics.median(flops_runs)
    lines = [
        "# Offline throughput: radixd ModelRunner vs transformers generate",
        "",
        f"Command: `{cmd}`",
        "",
        f"- model: `{os.path.basename(path)}` ({params / 1e6:.1f} M parameters per token, fp32 on CPU)",
        f"- CPU: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}, "
        f"load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
        f"- fp32 matmul (1024^3, median of {len(flops_runs)} samples spread over the run): "
        f"{flops / 1e9:.1f} GFLOP/s -> compute ceiling "
        f"{ceiling:.0f} tok/s (FLOP/s / (2 x params))",
        f"- batch-1 weight-streaming floor in this run: {floor * 1e3:.1f} ms per token (every weight "
        f"matvec once, nothing else) -> at most {1 / floor:.1f} tok/s at batch 1 for any fp32 implementation",
        f"- decode: prompts of {args.prompt_len} random tokens, {args.decode_tokens} timed greedy steps, "
        f"median of {args.repeats}; prefill excluded on both sides",
        "",
        "| batch | radixd decode tok/s | transformers decode tok/s | ratio | % of compute ceiling |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for b, ours, theirs in rows:
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        hf_s = f"{theirs:.1f}" if theirs else "-"
        lines.append(f"| {b} | {ours:.1f} | {hf_s} | {ratio} | {100 * ours / ceiling:.0f}% |")
    lines += [
        "",
        f"| {args.prefill_len}-token prefill | radixd | transformers | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| time (s) | {pre_ours:.3f} | {pre_hf:.3f} | {pre_hf / pre_ours:.2f}x |"
        if pre_hf
        else f"| time (s) | {pre_ours:.3f} | - | - |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
