"""What the benchmarks share: `radixd serve` and `radixd cluster` subprocesses on free loopback ports,
an engine sink that times outputs, the model's tokenizer and config without building the model, and
the daemon internals the benchmarks drive.

The benchmarks import daemon internals from here only, so a module that moves inside the daemon is one
edit in this file. Scripts run as `python bench/NAME.py`: Python puts bench/ first on the import path,
so `import benchkit` needs nothing else.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

K = TypeVar("K")

# Where each daemon internal the benchmarks use lives. Imported on first use (`from benchkit import
# EngineConfig` imports radixd.daemon.engine.config alone), so a benchmark pays only for what it
# touches: the radix-only ones never import torch. A name ending in `_module` is the module itself.
_DAEMON: dict[str, str] = {
    "DEFAULT_BLOCK_SIZE": "radixd.daemon.engine.config",
    "DEFAULT_KV_CACHE_GB": "radixd.daemon.engine.config",
    "EngineConfig": "radixd.daemon.engine.config",
    "EngineCore": "radixd.daemon.engine.core",
    "build_core": "radixd.daemon.engine.factory",
    "build_engine": "radixd.daemon.engine.factory",
    "KVManager": "radixd.daemon.engine.kv",
    "GenerateRequest": "radixd.daemon.engine.types",
    "RequestOutput": "radixd.daemon.engine.types",
    "Sink": "radixd.daemon.engine.types",
    "startup_heap_frozen": "radixd.daemon.process.host",
    "zeros_on_huge_pages": "radixd.daemon.process.host",
    "LoadedModel": "radixd.daemon.loaders",
    "convert": "radixd.daemon.loaders",
    "default_model_path": "radixd.daemon.loaders",
    "gguf_file_module": "radixd.daemon.loaders.gguf_file",
    "GGUFHeader": "radixd.daemon.loaders.gguf_header",
    "BLOCKS": "radixd.daemon.model.stored",
    "Gemm": "radixd.daemon.model.f32",
    "repack_x16": "radixd.daemon.model.quant",
    "cpu_flags": "radixd.kernels.native",
    "load_model": "radixd.daemon.loaders",
    "configure": "radixd.daemon.process.log",
    "AttentionMetadata": "radixd.daemon.model",
    "ModelConfig": "radixd.daemon.model",
    "ENV_DECODER": "radixd.daemon.model.native_decoder",
    "default_dtype_name": "radixd.daemon.model.precision",
    "resolve_precision": "radixd.daemon.model.precision",
    "QualityReport": "radixd.daemon.quality",
    "reference_log_probs": "radixd.daemon.quality",
    "teacher_forced_quality": "radixd.daemon.quality",
    "runner_module": "radixd.daemon.executor.runner",
    "ModelRunner": "radixd.daemon.executor.runner",
    "StepResult": "radixd.daemon.executor.runner",
    "StepSeq": "radixd.daemon.executor.runner",
    "num_blocks_for_budget": "radixd.daemon.executor.runner",
    "SampleResult": "radixd.daemon.executor.sampling",
    "SamplingParams": "radixd.daemon.executor.sampling",
    "SamplingState": "radixd.daemon.executor.sampling",
    "prompt_char_bound": "radixd.daemon.server.common.bounds",
    "OutputBridge": "radixd.daemon.server.common.bridge",
    "Limits": "radixd.daemon.server.common.state",
    "Constraint": "radixd.daemon.structured.spec",
}


def __getattr__(name: str) -> Any:
    """A daemon internal named in `_DAEMON`, imported now (and kept as a module global after)."""
    where = _DAEMON.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if name.endswith("_module") else getattr(module, name)
    globals()[name] = value
    return value


def copy_tokenizer(writer: Any, path: str) -> int:
    """Copy the `tokenizer.*` metadata of the GGUF at `path` into gguf-py's `writer`, read with the
    daemon's header reader (gguf-py's reader takes seconds per vocabulary); -> the vocabulary's size."""
    import gguf  # the bench scripts that write GGUFs need it; the others do not import it

    t = gguf.GGUFValueType
    fields = __getattr__("GGUFHeader")(path).fields
    for key, v in fields.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(v, list):
            item = v[0] if v else ""
            sub = t.STRING if isinstance(item, str) else t.FLOAT32 if isinstance(item, float) else t.INT32
            writer.add_key_value(key, v, t.ARRAY, sub)
        else:
            kind = {bool: t.BOOL, int: t.UINT32, float: t.FLOAT32, str: t.STRING}[type(v)]
            writer.add_key_value(key, v, kind)
    return len(fields["tokenizer.ggml.tokens"])


def write_report(lines: list[str], out: str | None) -> None:
    """Print a benchmark's markdown report and write it to `out` when given."""
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        Path(out).write_text(report)


def model_files(path: str | None = None) -> Any:
    """The model's tokenizer, config and weights as read from its file (default: the embedded SmolLM2;
    a `ConvertedModel`), without building the model: for benchmarks that need its vocabulary, not its
    forward pass."""
    return __getattr__("convert")(path or __getattr__("default_model_path")())


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (both commands then stop what they started), SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _launch(
    what: str, cmd: list[str], ready: Path, log: Path, timeout_s: float
) -> tuple[subprocess.Popen[bytes], Any]:
    """Start `cmd` (output to `log`) and wait for it to write `ready` (atomically, once it serves);
    -> the process and the ready file's JSON. Exits with the log's tail if it never gets there."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _end(proc)
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{what} did not start ({' '.join(cmd)}):\n{tail}")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())


class Timed:
    """An engine sink that keeps each request's tokens, when its first and last outputs arrived, and
    its TTFT as the engine measured it."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.ttft: dict[str, float] = {}
        self.errors: list[str] = []

    def __call__(self, out: Any) -> None:
        now = time.perf_counter()
        toks = self.tokens.setdefault(out.request_id, [])
        if not toks and out.new_token_ids:
            self.first[out.request_id] = now
            if out.ttft_s is not None:
                self.ttft[out.request_id] = out.ttft_s
        toks.extend(out.new_token_ids)
        self.last[out.request_id] = now
        if out.finish_reason == "error":
            self.errors.append(f"{out.request_id}: {out.error}")

    def decode_tps(self) -> float:
        """Tokens after each request's first, over the first first-token to the last output."""
        return self.decode_tokens() / self.decode_s()

    def decode_tokens(self) -> int:
        return sum(len(t) - 1 for t in self.tokens.values())

    def decode_s(self) -> float:
        return max(self.last.values()) - min(self.first.values())


def engine_cores(
    configs: Mapping[K, Any], dtype: str, threads: int, num_blocks: int
) -> tuple[Any, dict[K, Any]]:
    """The model (`load_model(dtype=...)`, torch on `threads` threads, warnings-only logs) and an
    `EngineCore` over it per `EngineConfig` in `configs`, each with a pool of `num_blocks`."""
    import torch

    __getattr__("configure")("warning")  # not a log line a request
    torch.set_num_threads(threads)
    lm = __getattr__("load_model")(dtype=dtype)
    build = __getattr__("build_core")
    return lm, {key: build(lm, cfg, num_blocks=num_blocks) for key, cfg in configs.items()}


def run_requests(core: Any, reqs: Sequence[Any]) -> Timed:
    """Add `reqs` (`GenerateRequest`s) to an `EngineCore` at once and run it until idle."""
    sink = Timed()
    for r in reqs:
        core.requests.add(r, sink)
    core.run_until_idle()
    if sink.errors:
        raise RuntimeError(sink.errors)
    return sink


class Daemon:
    """`radixd serve` as a subprocess on free loopback ports, `extra` flags appended; `address` and
    `admin_address` are its gRPC addresses once it serves. Use as a context manager, or call `stop()`."""

    def __init__(self, extra: Sequence[str] = (), timeout_s: float = 300.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="radixd-bench-")
        ready = Path(self._dir.name) / "ready.json"
        self.log = Path(self._dir.name) / "log"
        cmd = [sys.executable, "-m", "radixd.daemon.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        cmd += ["--admin-port", "0", "--metrics-port", "0", "--log-level", "warning"]
        cmd += ["--ready-file", str(ready), *extra]
        try:
            self.proc, info = _launch("radixd serve", cmd, ready, self.log, timeout_s)
        except SystemExit:
            self._dir.cleanup()
            raise
        self.address = f"127.0.0.1:{info['port']}"
        self.admin_address = f"127.0.0.1:{info['admin_port']}"

    def stop(self) -> None:
        """End the daemon (SIGTERM, then SIGKILL after 60 s) and remove its files."""
        _end(self.proc)
        self._dir.cleanup()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Cluster:
    """`radixd cluster` (smg in front of `replicas` radixd serves, each given `serve` flags) on free
    ports; `info` is its ready file (`openai_base_url`, `replicas` with each one's `address` and
    `admin_address`), `admin_token` the replicas' admin token. A context manager, or call `stop()`."""

    def __init__(
        self, replicas: int, serve: Sequence[str] = (), policy: str = "cache_aware", timeout_s: float = 300.0
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="radixd-bench-cluster-")
        where = Path(self._dir.name)
        self.admin_token = secrets.token_hex(16)
        cmd = [sys.executable, "-m", "radixd.daemon.cli", "cluster", "--replicas", str(replicas)]
        cmd += ["--port", "0", "--policy", policy, "--admin-token", self.admin_token]
        cmd += ["--ready-file", str(where / "ready.json"), "--log-dir", str(where / "logs"), "--", *serve]
        try:
            self.proc, self.info = _launch(
                "radixd cluster", cmd, where / "ready.json", where / "log", timeout_s
            )
        except SystemExit:
            self._dir.cleanup()
            raise

    @property
    def base(self) -> str:
        """smg's OpenAI base URL (`http://HOST:PORT/v1`)."""
        return str(self.info["openai_base_url"])

    def stop(self) -> None:
        """End the command (it stops smg and the replicas), SIGKILL whatever is left of them (they run
        in sessions of their own), and remove the files."""
        _end(self.proc)
        for pid in (self.info["gateway_pid"], *(r["pid"] for r in self.info["replicas"])):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._dir.cleanup()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
