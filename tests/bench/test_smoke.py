"""Every benchmark in bench/ runs: each script, as a subprocess with tiny arguments, exits 0 and prints
its table (the numbers mean nothing at these sizes; that the code paths run is what is checked).

What this repository does not hold is not needed here: benchmarks beside llama.cpp or the SGLang peer
bench are checked to say what is missing, and the GPU check runs its CPU dry run. The served ones talk
to one `radixd serve` started for this module (bench/benchkit.py's launcher, as the benchmarks start it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
MODULES = {"benchkit.py", "llama_server.py"}  # imported by the benchmarks, not run

# script -> its smoke runs' arguments and a line of the table it must print
RUNS: dict[str, tuple[str, str]] = {
    "fragmentation.py": ("--requests 12 --budget-gib 4", "| shared system prompt, n=4 | radix-16 |"),
    "block_layout.py": ("--churn 0.05 --concurrent 2 --turns 2", "| busy |"),
    "kernels_cpu.py": ("--ctx 64 --layers 1 --rounds 1 --pool-gib 0.01 --read-mib 8", "| split |"),
    "decode_chunks.py": ("--shapes 2x40 --rounds 1 --layers 2 --pool-blocks 64", "| 2 x 40 |"),
    # the daemon's handover (--sink bridge) covers the default counting sink's path and more
    "sched_overhead.py": (
        "--seqs 8 --groups 2 --prefix 64 --suffix 16 --steps 4 --sink bridge",
        "| **outside the forward pass** |",
    ),
}
# loading the real model: slow
MODEL_RUNS: dict[str, tuple[str, str]] = {
    "offline.py": (
        "--dtypes float32 --batches 1 --prompt-len 8 --decode-tokens 2 --prefill-batch 1 --repeats 1 "
        "--no-quality --threads 1",
        "| batch 1 |",
    ),
    "workloads.py": ("--workloads n8 --gen 2 --scale 0.05 --num-blocks 256", "| n8 | off |"),
    # the embedded model (Q4_1, a Q8_0 head): stored, or repacked where this CPU runs x16
    "kquant_layouts.py": (
        "--repeats 1 --prompt-len 8 --decode-tokens 2 --prefill-batch 1",
        "| decode batch 8 |",
    ),
    "speculative.py": (
        "--rounds 1 --warmup 0 --batches 1 --traces chat --max-tokens 4 --threads 1",
        "| radixd | chat | 1 |",
    ),
    "structured.py": ("--rounds 1 --batch 2 --max-tokens 8 --ttft-reps 1 --threads 1", "| radixd | 2 |"),
    # its own `radixd cluster` (one policy's; the smg overhead pass is the same launcher and client)
    "cluster_bench.py": (
        "--policies round_robin --tenants 1 --conversations 2 --turns 2 --words 2 --max-tokens 2 "
        "--overhead-requests 0 --replicas 1",
        "| round_robin | 4 |",
    ),
    # its own `radixd cluster` (one replica), the tool loop through the official openai client
    "agent_loop.py": ("--smoke --max-tokens 24", "| answer |"),
    # a tiny random Gemma 3 written with gguf-py, its own `radixd serve` per layout and pool
    "hybrid_cache.py": ("--quick", "| radixd "),
}
# against the module's daemon (--address is added)
SERVED_RUNS: dict[str, tuple[str, str]] = {
    "serve_bench.py": (
        "--workload both --concurrency 1 --turns 1 --forks 2 --max-tokens 2",
        "| agent / cache |",
    ),
    "big_prompt_latency.py": ("--rounds 1 --seconds 1", "| over-bound |"),
    "serve_step.py": ("--offline --contexts 16 --max-tokens 4 --rounds 1", "| 16 |"),
}
# needing what the repository does not hold (MISSING: a path where nothing is)
MISSING_RUNS: dict[str, tuple[str, str]] = {
    "single_stream.py": ("--llama-server MISSING", "no llama-server binary at"),
    "radix_adapter.py": ("--peer-bench MISSING", "needs the peer bench radix_peer_bench.py"),
    "tokenizer_parity.py": ("--llama-server MISSING", "no llama-server binary at"),
    "formats.py": ("--llama-quantize MISSING", "no llama-quantize binary at"),
    "llama_parity.py": ("--llama-server MISSING", "no llama-server binary at"),
}


def run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python bench/SCRIPT ARGS...` (`bash` for a .sh) from the repository root, output captured."""
    cmd = ["bash"] if script.endswith(".sh") else [sys.executable]
    return subprocess.run(
        [*cmd, str(BENCH / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def check(proc: subprocess.CompletedProcess[str], table_row: str) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert table_row in proc.stdout, proc.stdout[-3000:]


@pytest.fixture(autouse=True)
def private_cache(model_cache_dir: Path) -> Path:
    """Kernels the benchmarks build and the converted model go to the session's cache, never the user's."""
    return model_cache_dir


def test_every_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh", ".c")} - MODULES
    covered = {
        *RUNS,
        *MODEL_RUNS,
        *SERVED_RUNS,
        *MISSING_RUNS,
        "gpu_check.py",
        "gpu_check.sh",
        "user_model.py",
    }
    assert scripts == covered


def test_benchmarks_import_the_installed_package_only() -> None:
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path.name
        assert "from tests" not in text and "import tests" not in text, path.name


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark(script: str) -> None:
    args, table_row = RUNS[script]
    check(run(script, *args.split()), table_row)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(MODEL_RUNS))
def test_benchmark_on_the_model(script: str) -> None:
    args, table_row = MODEL_RUNS[script]
    check(run(script, *args.split()), table_row)


def _benchkit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchkit", BENCH / "benchkit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(model_cache_dir: Path) -> Iterator[Any]:
    """One `radixd serve` (a small pool) for the served benchmarks."""
    with _benchkit().Daemon(["--num-blocks", "512"]) as daemon:
        yield daemon


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SERVED_RUNS))
def test_served_benchmark(script: str, served: Any) -> None:
    args, table_row = SERVED_RUNS[script]
    check(run(script, "--address", served.address, *args.split()), table_row)


@pytest.mark.parametrize("script", sorted(MISSING_RUNS))
def test_benchmark_says_what_is_missing(script: str, tmp_path: Path) -> None:
    args, message = MISSING_RUNS[script]
    proc = run(script, *args.replace("MISSING", str(tmp_path / "absent")).split())
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_user_model_benchmark(tmp_path: Path) -> None:
    """bench/user_model.py at a tiny shape without llama.cpp: gguf-py writes the Q4_1 file (the
    Q4_K_M one needs llama-quantize and is said not built), radixd loads it cold and warm and runs it
    offline, and the served part says what it lacks."""
    args = f"--dir {tmp_path} --no-llama --hidden 128 --intermediate 256 --layers 2 --heads 2 --kv-heads 1"
    proc = run("user_model.py", *args.split(), "--decode-tokens", "2")
    check(proc, "| radixd serve, later start | ")
    assert "| batch 1 |" in proc.stdout and "refused" not in proc.stdout
    assert "Q4_K_M: not built (no llama-quantize)" in proc.stdout
    assert "skipped: needs llama-server (--no-llama)" in proc.stdout


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    """`make gpu-check`'s script, its CPU dry run at one small shape (on a CUDA machine too)."""
    # the engine and correctness parts run in tests/kernels/test_gpu_check.py
    args = "--dry-run --skip-engine --skip-correctness --models SmolLM2-135M --batches 1 --ctxs 1024"
    args += f" --out {tmp_path}"
    proc = run("gpu_check.sh", *args.split(), env={"PYTHON": sys.executable})
    check(proc, "| SmolLM2-135M |")
