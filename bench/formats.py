"""Every GGUF format radixd runs, on a real model: the embedded SmolLM2 requantized by llama.cpp's
`llama-quantize` into each format, then for each file `auto`'s mode against the same file in float32
(its blocks dequantized: the quality contract of daemon/quality.py, teacher-forced over the fixed
text), the tensors' formats, and the load time of each mode.

    .venv/bin/python bench/formats.py --llama-quantize DIR/llama.cpp/build/bin/llama-quantize \\
        --dir DIR/formats --out docs/measurements/bench-formats.md
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import subprocess
import sys
import time
from pathlib import Path

import gguf
from benchkit import (
    GGUFHeader,
    ModelRunner,
    cpu_flags,
    default_model_path,
    load_model,
    reference_log_probs,
    teacher_forced_quality,
    write_report,
)

QUALITY_TEXT = Path(__file__).resolve().parent.parent / "tests" / "daemon" / "data" / "quality_text.md"
# llama-quantize's names: the legacy formats, the K-quant mixes users download, and Q6_K alone.
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")
BLOCK = 16


def quantize(tool: str, src: str, out: Path, fmt: str) -> None:
    if not out.exists():
        cmd = [tool, "--allow-requantize", src, str(out), fmt]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")


def formats_of(path: Path) -> str:
    """The file's 2-D tensors' formats with their counts, most common first."""
    tensors = GGUFHeader(str(path)).tensors
    kinds = collections.Counter(
        gguf.GGMLQuantizationType(t.type_id).name for t in tensors if len(t.dims) == 2
    )
    return ", ".join(f"{k} x{n}" for k, n in kinds.most_common())


def measure(path: Path, ids: list[int]) -> str:
    t0 = time.perf_counter()
    ref_lm = load_model(str(path), dtype="float32")
    t1 = time.perf_counter()
    lm = load_model(str(path), dtype="auto")
    t2 = time.perf_counter()
    blocks = len(ids) // BLOCK + 2
    ref = reference_log_probs(ModelRunner(ref_lm.model, blocks, BLOCK), ids)
    q = teacher_forced_quality(ref, ModelRunner(lm.model, blocks, BLOCK), ids)
    ok = "yes" if q.meets_contract() else "**no**"
    fmt = path.stem.rsplit("-", 1)[-1]
    return (
        f"| {fmt} | {formats_of(path)} | {lm.model.precision.name} | {q.mean_kl:.4f} | "
        f"{q.top1_agreement:.3f} | {q.ppl_change * 100:+.2f}% | {ok} | {t1 - t0:.1f} / {t2 - t1:.1f} |"
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-quantize", required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--dir", default="formats-out", help="where the requantized files go (reused)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="llama-quantize format names")
    ap.add_argument("--out", help="write the markdown report here")
    args = ap.parse_args(argv)
    if not Path(args.llama_quantize).is_file():
        raise SystemExit(
            f"no llama-quantize binary at {args.llama_quantize}: build llama.cpp's tools "
            "(e.g. shared/bench/build_llama_cpp.sh DIR) and pass "
            "--llama-quantize DIR/llama/build/bin/llama-quantize"
        )
    src = default_model_path()
    out_dir = Path(args.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = load_model(src, dtype="float32").tokenizer.encode(QUALITY_TEXT.read_text())
    isa = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx"))))
    lines = [
        f"# Every format on a real model ({datetime.date.today()})",
        "",
        f"`{' '.join(['python bench/formats.py', *argv])}` on {platform.machine()}, CPU flags: {isa}. "
        "The embedded SmolLM2-135M (Q4_1) requantized by llama-quantize; `auto` "
        "against float32 on the same file (its blocks dequantized), teacher-forced over the "
        f"{len(ids)}-token quality text. Contract: mean KL <= 0.02, top-1 >= 95%, perplexity within 2%.",
        "",
        "| format | matrices | auto | mean KL | top-1 | perplexity | contract | load s (float32 / auto) |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for fmt in args.formats.split(","):
        path = out_dir / f"smollm2-135m-{fmt}.gguf"
        quantize(args.llama_quantize, src, path, fmt)
        lines.append(measure(path, ids))
        print(lines[-1], flush=True)
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
