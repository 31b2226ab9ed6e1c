"""The two weight layouts on one GGUF model, in one process: the file's blocks (``stored``: Q4_1 and
Q8_0 split, kernels/a8_gemm.c; K-quants as mapped, kernels/kquant_gemm.c) against 16 rows interleaved
at load (``x16``: kernels/legacy_x16.c, kernels/kquant_x16.c), for every format that has both.

Both models are loaded (``RADIXD_KQUANT_LAYOUT`` set for each), their logits on a prompt compared
(bitwise equal for the K-quants; the legacy formats' repacked kinds differ in the last bits), then timed
alternately, one of each per repeat, through ``ModelRunner.step`` as bench/offline.py drives it: a
prefill of ``--prefill-batch`` x ``--prompt-len`` tokens, and greedy decode steps at batch 1 and 8.
Each figure is tokens / seconds, from the wall clock (median and best of the repeats) and from the
process's CPU time (median): with ``--threads 1`` the CPU time is the step's own work, which a shared
machine's other loads leave nearly untouched where they stretch the wall time.

With ``--llama-bin`` (llama.cpp's build/bin), llama.cpp on the same file and thread count by the same
CPU-time measure: each run's process CPU time (user + sys), less that of a run doing (almost) nothing
after the same load (``llama-bench`` with a 1-token prompt; ``llama-batched-bench`` with 1 generated
token), for its prefill of ``--prompt-len`` tokens, decode at batch 1 and decode at batch 8.

    .venv/bin/python bench/kquant_layouts.py --model DIR/llama-h2048-l16-q4_k_m.gguf --threads 1 \
        --llama-bin LLAMA_BIN
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time
from collections.abc import Callable

import torch
from benchkit import StepSeq, default_model_path, load_model, write_report
from offline import RadixdSide

LAYOUTS = ("stored", "x16")


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def child_cpu_s(cmd: list[str]) -> float:
    """CPU seconds (user + sys) the command's process took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def llama_cpu_rates(bin_dir: str, model: str, a: argparse.Namespace) -> dict[str, float]:
    """llama.cpp's tokens per CPU second: phase name -> rate (the module's docstring)."""
    runs, t = max(a.repeats, 2), str(a.threads)
    bench = [os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", t, "--no-warmup", "-r", str(runs)]
    base = min(child_cpu_s([*bench, "-p", "1", "-n", "0"]) for _ in range(2))
    pp = child_cpu_s([*bench, "-p", str(a.prompt_len), "-n", "0"]) - base
    tg = child_cpu_s([*bench, "-p", "0", "-n", str(a.decode_tokens)]) - base
    batched = [os.path.join(bin_dir, "llama-batched-bench"), "-m", model, "-t", t, "-npp", str(a.prompt_len)]
    ctx = str(8 * (a.prompt_len + a.decode_tokens + 1) + 64)

    def b8(ntg: int) -> float:
        return min(child_cpu_s([*batched, "-ntg", str(ntg), "-npl", "8", "-c", ctx]) for _ in range(2))

    steps = b8(a.decode_tokens + 1) - b8(1)
    return {
        "prefill": runs * a.prompt_len / pp,
        "decode batch 1": runs * a.decode_tokens / tg,
        "decode batch 8": 8 * a.decode_tokens / steps,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default=None,
        help="a GGUF file with legacy (Q4_0 .. Q8_0), Q4_K or Q6_K matrices (default: the embedded model)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--prefill-batch", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--llama-bin", default=None, help="llama.cpp's build/bin: time it too (CPU time)")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    a.model = a.model or str(default_model_path())
    sides: dict[str, RadixdSide] = {}
    lines = [f"`{a.model.rsplit('/', 1)[-1]}`, {a.threads} thread(s), {a.repeats} alternating repeats", ""]
    for layout in LAYOUTS:
        os.environ["RADIXD_KQUANT_LAYOUT"] = layout
        t0 = time.perf_counter()
        lm = load_model(a.model, dtype="auto")
        codings = sorted({str(getattr(p, "coding", "")) for p in lm.model.projections()})
        lines.append(f"- {layout}: loaded in {time.perf_counter() - t0:.1f} s; parts {', '.join(codings)}")
        sides[layout] = RadixdSide(lm, 8, a.prompt_len + a.decode_tokens + 1, 16, scattered=False)
    g = torch.Generator().manual_seed(0)
    vocab = sides["stored"].lm.config.vocab_size
    prompts = [[int(t) for t in torch.randint(0, vocab, (a.prompt_len,), generator=g)] for _ in range(8)]
    logits = [
        s.runner.step_logits([StepSeq(0, prompts[0][:32], 0, s._tables(1)[0], None)]) for s in sides.values()
    ]
    rel = float((logits[0] - logits[1]).abs().max() / logits[0].abs().max())
    same = torch.equal(logits[0], logits[1])
    lines.append(f"- logits of a 32-token prompt bitwise equal: {same} (max diff / max |logit| {rel:.1e})")
    # name, tokens, (side -> wall and CPU seconds)
    phases: list[tuple[str, int, Callable[[RadixdSide], tuple[float, float]]]] = [
        (
            f"prefill {a.prefill_batch} x {a.prompt_len}",
            a.prefill_batch * a.prompt_len,
            lambda s: timed(lambda: s.prefill(prompts[: a.prefill_batch])),
        )
    ]
    for b in (1, 8):
        phases.append(
            (f"decode batch {b}", b * a.decode_tokens, lambda s, b=b: s.decode(prompts[:b], a.decode_tokens))
        )
    lines += [
        "",
        "| phase | stored tok/s: wall median / best; CPU | x16 tok/s: wall median / best; CPU "
        "| x16 / stored: wall; CPU |",
        "| --- | --- | --- | --- |",
    ]
    rates: dict[str, dict[str, float]] = {}
    for name, tokens, run in phases:
        wall: dict[str, list[float]] = {k: [] for k in LAYOUTS}
        cpu: dict[str, list[float]] = {k: [] for k in LAYOUTS}
        for _ in range(a.repeats):
            for layout, side in sides.items():
                w, c = run(side)
                wall[layout].append(w)
                cpu[layout].append(c)
        cells = []
        for layout in LAYOUTS:
            med, best = tokens / statistics.median(wall[layout]), tokens / min(wall[layout])
            cells.append(f"{med:.1f} / {best:.1f}; {tokens / statistics.median(cpu[layout]):.1f}")
        ratio = statistics.median(s / x for s, x in zip(wall["stored"], wall["x16"], strict=True))
        cpu_ratio = statistics.median(cpu["stored"]) / statistics.median(cpu["x16"])
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {ratio:.2f}x; {cpu_ratio:.2f}x |")
        print(lines[-1], flush=True)
        rates[name] = {k: tokens / statistics.median(cpu[k]) for k in LAYOUTS}
    if a.llama_bin:
        llama = llama_cpu_rates(a.llama_bin, a.model, a)
        lines += [
            "",
            f"llama.cpp, {a.threads} thread(s), tokens per CPU second (prefill: a prompt of {a.prompt_len})",
            "",
            "| phase | llama.cpp | stored / llama.cpp | x16 / llama.cpp |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name, r in rates.items():
            ref = llama[name.split(" ", 1)[0] if name.startswith("prefill") else name]
            lines.append(f"| {name} | {ref:.1f} | {r['stored'] / ref:.2f}x | {r['x16'] / ref:.2f}x |")
    write_report(lines, a.out)


if __name__ == "__main__":
    main()
