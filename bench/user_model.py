"""radixd on a model of a user's size beside llama.cpp (issue 40): a llama-shaped GGUF with random
weights and SmolLM2's real tokenizer, quantized as users get it, then loaded, run offline and served.

Build (`--dir DIR`, cached: files there are reused): an F16 GGUF in llama.cpp's conventions (architecture
`llama`, its key names, Q/K rows in its RoPE permutation; the tokenizer, merges and chat template copied
from the embedded SmolLM2 file), then `llama-quantize` to each `--quants` kind; the F16 file is deleted
once they exist (`--keep-base` keeps it). Weights are normal with std 0.5 / sqrt(fan_in) (norms ones),
so activations stay of order one through every layer. Without llama-quantize (`--no-llama`), the Q4_1
file is written by gguf-py's own quantizer and the other kinds are reported as not built.

Measured per file, each beside llama.cpp in the same run (`--parts`):
- load: seconds from process start to ready, first start (radixd's cache dir fresh, built kernels
  copied in: whatever a model would leave there is cold) and a later start, peak RSS while loading (VmHWM)
  and resident memory once ready (VmRSS, highest of samples over a second), bytes the start wrote to
  the cache dir; `radixd serve --model FILE` against `llama-server -m FILE` (ready: /health answers);
- offline: bench/offline.py (`--dtypes auto`, decode batch 1 and 8, prefill 4 x 128) with
  llama-batched-bench;
- serve: bench/single_stream.py against llama-server.
The offline and served runs keep radixd's cache (built kernels) in $RADIXD_CACHE_DIR, else DIR/radixd-cache.

    .venv/bin/python bench/user_model.py --dir DIR --llama-bin DIR/llama/build/bin \\
        --out docs/measurements/bench-user-model.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
from benchkit import Daemon, GGUFHeader, copy_tokenizer, default_model_path
from llama_server import free_port

BENCH = Path(__file__).resolve().parent
FLAG_FAMILIES = ("avx", "fma", "f16c", "amx", "vnni", "bf16", "sse4", "neon", "sve")


def tensors(a: argparse.Namespace) -> Iterator[tuple[str, tuple[int, ...], float]]:
    """(name, numpy shape, std) of every tensor in file order; std 0 marks a norm (ones)."""
    h, f, hd = a.hidden, a.intermediate, a.hidden // a.heads
    yield "token_embd.weight", (a.vocab, h), 1.0
    for i in range(a.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,), 0.0
        yield b + "attn_q.weight", (a.heads * hd, h), 0.5 / h**0.5
        yield b + "attn_k.weight", (a.kv_heads * hd, h), 0.5 / h**0.5
        yield b + "attn_v.weight", (a.kv_heads * hd, h), 0.5 / h**0.5
        yield b + "attn_output.weight", (h, a.heads * hd), 0.5 / (a.heads * hd) ** 0.5
        yield b + "ffn_norm.weight", (h,), 0.0
        yield b + "ffn_gate.weight", (f, h), 0.5 / h**0.5
        yield b + "ffn_up.weight", (f, h), 0.5 / h**0.5
        yield b + "ffn_down.weight", (h, f), 0.5 / f**0.5
    yield "output_norm.weight", (h,), 0.0
    yield "output.weight", (a.vocab, h), 1.0 / h**0.5


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row order for `llama` (interleaved RoPE): rows (head, 2, pair) -> (head, pair, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, a: argparse.Namespace, qtype: gguf.GGMLQuantizationType) -> None:
    """Write the model to `path` with every matrix in `qtype` (F16 or a type gguf-py quantizes), tensor
    by tensor (never the whole model in memory); norms F32 as llama.cpp keeps them."""
    w = gguf.GGUFWriter(str(path) + ".part", "llama")
    w.add_name(f"random llama {a.hidden}x{a.layers}")
    w.add_context_length(8192)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.intermediate)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(a.hidden // a.heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(a.vocab)
    kind = (
        gguf.LlamaFileType.MOSTLY_F16
        if qtype == gguf.GGMLQuantizationType.F16
        else gguf.LlamaFileType.MOSTLY_Q4_1
    )
    w.add_file_type(kind)
    copy_tokenizer(w, default_model_path())
    for name, shape, std in tensors(a):
        if std == 0.0:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor_info(name, shape, np.dtype(np.float16), 2 * shape[0] * shape[1])
        else:
            bshape = gguf.quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), bshape[0] * bshape[1], raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, shape, std in tensors(a):
        if std == 0.0:
            w.write_tensor_data(np.ones(shape, np.float32))
            continue
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if name.endswith("attn_q.weight"):
            x = permute(x, a.heads)
        elif name.endswith("attn_k.weight"):
            x = permute(x, a.kv_heads)
        w.write_tensor_data(
            x.astype(np.float16) if qtype == gguf.GGMLQuantizationType.F16 else gguf.quants.quantize(x, qtype)
        )
    w.close()
    os.replace(str(path) + ".part", path)


def build(a: argparse.Namespace) -> dict[str, Path]:
    """The `--quants` files in `--dir` (built if absent); -> kind -> path, for the kinds built."""
    a.dir.mkdir(parents=True, exist_ok=True)
    stem = f"llama-h{a.hidden}-l{a.layers}"
    out = {q: a.dir / f"{stem}-{q.lower()}.gguf" for q in a.quants}
    quantize = None if a.no_llama else a.llama_bin / "llama-quantize"
    if quantize is None or not quantize.exists():
        if "Q4_1" in out and not out["Q4_1"].exists():
            print(f"building {out['Q4_1'].name} with gguf-py's quantizer", flush=True)
            write_gguf(out["Q4_1"], a, gguf.GGMLQuantizationType.Q4_1)
        for q in [q for q, p in out.items() if not p.exists()]:
            print(f"{q}: not built (no llama-quantize)", flush=True)
            del out[q]
        return out
    base = a.dir / f"{stem}-f16.gguf"
    missing = [q for q, p in out.items() if not p.exists()]
    if missing and not base.exists():
        t0 = time.perf_counter()
        write_gguf(base, a, gguf.GGMLQuantizationType.F16)
        print(
            f"wrote {base.name} ({base.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    for q in missing:
        t0 = time.perf_counter()
        cmd = ["nice", str(quantize), str(base), str(out[q]) + ".part", q, str(a.threads)]
        subprocess.run(cmd, check=True, capture_output=True)
        os.replace(str(out[q]) + ".part", out[q])
        print(f"quantized {out[q].name} in {time.perf_counter() - t0:.0f} s", flush=True)
    if base.exists() and not a.keep_base:
        base.unlink()
    return out


def proc_status(pid: int) -> dict[str, int]:
    """/proc/PID/status's memory lines, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if val.strip().endswith("kB"):
            out[key] = int(val.split()[0]) * 1024
    return out


def memory_once_ready(pid: int) -> tuple[int, int]:
    """(VmHWM, highest VmRSS sampled over the next second) of a process that just became ready."""
    rss = 0
    for _ in range(10):
        st = proc_status(pid)
        rss = max(rss, st["VmRSS"])
        time.sleep(0.1)
    return st["VmHWM"], rss


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


Row = dict[str, float | str]


def radixd_start(model: Path, cache: Path, timeout_s: float) -> Row:
    """One `radixd serve --model` start with RADIXD_CACHE_DIR=`cache`; -> its load figures."""
    before = tree_bytes(cache)
    os.environ["RADIXD_CACHE_DIR"] = str(cache)
    t0 = time.perf_counter()
    try:
        daemon = Daemon(["--model", str(model)], timeout_s=timeout_s)
    except SystemExit as e:  # refused: the daemon's last line says why
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else str(e)}
    ready = time.perf_counter() - t0
    try:
        peak, rss = memory_once_ready(daemon.proc.pid)
    finally:
        daemon.stop()
    return {"ready_s": ready, "peak": peak, "rss": rss, "written": tree_bytes(cache) - before}


def llama_start(server: Path, model: Path, threads: int, context: int, timeout_s: float) -> Row:
    """One `llama-server -m` start; -> its load figures (ready: /health answers 200)."""
    port = free_port()
    cmd = [str(server), "-m", str(model), "--port", str(port), "-t", str(threads), "-c", str(context)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if proc.poll() is not None or time.perf_counter() - t0 > timeout_s:
                proc.kill()
                tail = [ln for ln in proc.communicate()[1].splitlines() if ln.strip()]
                return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - t0
        peak, rss = memory_once_ready(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return {"ready_s": ready, "peak": peak, "rss": rss, "written": 0}


def median_row(rows: list[Row]) -> Row:
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return rows[0]
    return {k: statistics.median(float(r[k]) for r in ok) for k in ok[0]}


def load_part(a: argparse.Namespace, files: dict[str, Path], kernels: Path) -> list[str]:
    """The load table: per file, radixd's first and later start and llama-server's start."""
    lines = [
        "| file (size) | server, start | ready (s) | peak RSS loading (GB) | RSS once ready (GB) "
        "| cache written (GB) |"
    ]
    lines.append("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, path in files.items():
        runs: dict[str, list[Row]] = {}
        for _ in range(a.load_repeats):
            if not a.llama_only:
                with tempfile.TemporaryDirectory(prefix="radixd-cache-", dir=a.dir) as fresh:
                    shutil.copytree(kernels, Path(fresh) / "kernels")
                    runs.setdefault("radixd serve, first start", []).append(
                        radixd_start(path, Path(fresh), a.timeout)
                    )
                    runs.setdefault("radixd serve, later start", []).append(
                        radixd_start(path, Path(fresh), a.timeout)
                    )
            if not a.no_llama:
                row = llama_start(a.llama_bin / "llama-server", path, a.threads, a.llama_context, a.timeout)
                runs.setdefault("llama-server", []).append(row)
        size = f"{name} ({path.stat().st_size / 1e9:.2f} GB)"
        first = len(lines)
        for side, rows in runs.items():
            r = median_row(rows)
            if "error" in r:
                lines.append(f"| {size} | {side} | refused: {r['error']} | | | |")
                continue
            gb = [float(r[k]) / 1e9 for k in ("peak", "rss", "written")]
            lines.append(
                f"| {size} | {side} | {float(r['ready_s']):.1f} | {gb[0]:.2f} | {gb[1]:.2f} | {gb[2]:.2f} |"
            )
        print("\n".join(lines[first:]), flush=True)
    return lines


def bench_script(a: argparse.Namespace, script: str, args: list[str]) -> list[str]:
    """Run bench/SCRIPT (niced, time-boxed by `--part-timeout`); -> its table lines and the command."""
    cmd = ["nice", sys.executable, str(BENCH / script), *args]
    shown = " ".join(["python", f"bench/{script}", *args])
    # NOTE: a session of its own, so a run past its time goes with the servers it started
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=a.part_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print(f"{script}: stopped after {a.part_timeout:.0f} s", flush=True)
        return [f"`{shown}`: stopped after {a.part_timeout:.0f} s (--part-timeout)", ""]
    if proc.returncode != 0:
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        return [f"`{shown}` failed:", "", "```", *tail, "```", ""]
    table: list[str] = []
    gap = False  # a line left out since the last kept one: a table ended there
    for ln in stdout.splitlines():
        if not ln.startswith(("|", "llama.cpp per", "radixd per", "rounds:")):
            gap = True
            continue
        table += [""] if gap and table else []
        table.append(ln)
        gap = False
    print("\n".join(table), flush=True)
    return [f"`{shown}`", "", *table, ""]


def cpu_flags() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            flags = line.split(":", 1)[1].split()
            return " ".join(
                f for f in flags if f.startswith(FLAG_FAMILIES) or any(x in f for x in ("vnni", "bf16"))
            )
    return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="where the GGUF files are built (and reused)")
    ap.add_argument("--llama-bin", type=Path, default=Path("llama/build/bin"), help="llama.cpp's build/bin")
    ap.add_argument("--no-llama", action="store_true", help="radixd alone (no llama.cpp binaries needed)")
    ap.add_argument(
        "--llama-only", action="store_true", help="load on llama-server alone (a file radixd cannot hold)"
    )
    ap.add_argument("--parts", default="load,offline,serve")
    ap.add_argument("--quants", default="Q4_K_M,Q4_1", type=lambda s: s.split(","))
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--keep-base", action="store_true", help="keep the F16 file after quantizing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="offline repeats and served rounds (medians)")
    ap.add_argument("--load-repeats", type=int, default=1, help="starts per side (medians)")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--serve-tokens", type=int, default=32)
    ap.add_argument(
        "--llama-context",
        type=int,
        default=0,
        help="llama-server -c (default: the tokens of radixd's KV pool, 1 GiB of 16-bit K and V)",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a server may take to start")
    ap.add_argument(
        "--part-timeout", type=float, default=600.0, help="seconds each offline / serve run may take"
    )
    ap.add_argument(
        "--also-load", type=Path, nargs="*", default=[], help="more GGUF files to load (load part)"
    )
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    a = ap.parse_args()
    a.vocab = len(GGUFHeader(default_model_path()).fields["tokenizer.ggml.tokens"])
    os.environ["RADIXD_NUM_THREADS"] = str(a.threads)
    # NOTE: radixd's default pool (DEFAULT_KV_CACHE_GB), K and V in 16 bits: the same bytes on both sides
    a.llama_context = a.llama_context or (1 << 30) // (4 * a.layers * a.kv_heads * (a.hidden // a.heads))
    parts = a.parts.split(",")
    started = datetime.datetime.now(datetime.UTC)
    files = build(a)
    report = [
        f"Command: `python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}`",
        "",
        f"- run: {started:%Y-%m-%d %H:%M} UTC; {a.threads} threads on every side; "
        f"{a.repeats} repeat(s) ({a.load_repeats} for load), medians; load average at the start "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"- CPU: {platform.machine()}, {os.cpu_count()} CPUs, flags: {cpu_flags()}",
        f"- model: llama, hidden {a.hidden}, intermediate {a.intermediate}, {a.layers} layers, "
        f"{a.heads} / {a.kv_heads} heads, vocab {a.vocab}; files: "
        + ", ".join(f"{k} {p.stat().st_size / 1e9:.2f} GB" for k, p in files.items()),
        f"- load: llama-server -c {a.llama_context} (1 GiB of 16-bit K and V, radixd's default pool); "
        "radixd's first start: a fresh cache dir holding only the built kernels",
        "",
    ]
    # the offline and served runs' cache (the built kernels), kept between runs
    cache = Path(os.environ.get("RADIXD_CACHE_DIR") or a.dir / "radixd-cache")
    os.environ["RADIXD_CACHE_DIR"] = str(cache)
    if "load" in parts:
        subprocess.run(
            [sys.executable, "-c", "from radixd.kernels.native import library; library()"], check=True
        )
        report += [
            "## Load",
            "",
            *load_part(a, {**files, **{p.name: p for p in a.also_load}}, cache / "kernels"),
            "",
        ]
        os.environ["RADIXD_CACHE_DIR"] = str(cache)
    for name, path in files.items():
        if "offline" in parts:
            args = ["--model", str(path), "--dtypes", "auto", "--batches", "1,8", "--prefill-batch", "4"]
            args += [
                "--prompt-len",
                "128",
                "--decode-tokens",
                str(a.decode_tokens),
                "--repeats",
                str(a.repeats),
            ]
            args += ["--threads", str(a.threads), "--no-quality"]
            if not a.no_llama:
                args += ["--llama-batched-bench", str(a.llama_bin / "llama-batched-bench")]
            report += [f"## Offline, {name}", "", *bench_script(a, "offline.py", args)]
        if "serve" in parts:
            report += [f"## Served one stream, {name}", ""]
            if a.no_llama:
                report += ["skipped: needs llama-server (--no-llama)", ""]
                continue
            args = ["--model", str(path), "--llama-server", str(a.llama_bin / "llama-server")]
            args += ["--threads", str(a.threads), "--rounds", str(a.repeats), "--contexts", "32"]
            args += [
                "--max-tokens",
                str(a.serve_tokens),
                "--system",
                "256",
                "--turns",
                "2",
                "--turn-tokens",
                "16",
            ]
            args += ["--conversations", "2", "--many-turns", "2"]
            report += bench_script(a, "single_stream.py", args)
    report.append("load average at the end: " + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    text = "\n".join(report)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
