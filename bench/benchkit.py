"""What the benchmarks share: a `radixd serve` subprocess on free loopback ports, the model's tokenizer
and config without building the model, and the daemon internals the benchmarks drive.

The benchmarks import daemon internals from here only, so a module that moves inside the daemon is one
edit in this file. Scripts run as `python bench/NAME.py`: Python puts bench/ first on the import path,
so `import benchkit` needs nothing else.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    "load_model": "radixd.daemon.loaders",
    "configure": "radixd.daemon.process.log",
    "AttentionMetadata": "radixd.daemon.model",
    "ModelConfig": "radixd.daemon.model",
    "ENV_DECODER": "radixd.daemon.model.native_decoder",
    "default_dtype_name": "radixd.daemon.model.precision",
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


def model_files(path: str | None = None) -> Any:
    """The model's tokenizer, config and weights as read from its file (default: the embedded SmolLM2;
    a `ConvertedModel`), without building the model: for benchmarks that need its vocabulary, not its
    forward pass."""
    return __getattr__("convert")(path or __getattr__("default_model_path")())


class Daemon:
    """`radixd serve` as a subprocess on free loopback ports, `extra` flags appended; `address` is its
    gRPC address once it serves. Use as a context manager, or call `stop()`."""

    def __init__(self, extra: Sequence[str] = (), timeout_s: float = 300.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="radixd-bench-")
        ready = Path(self._dir.name) / "ready.json"
        self.log = Path(self._dir.name) / "log"
        cmd = [sys.executable, "-m", "radixd.daemon.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        cmd += ["--admin-port", "0", "--metrics-port", "0", "--log-level", "warning"]
        cmd += ["--ready-file", str(ready), *extra]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while not ready.exists():  # the daemon writes it atomically once it serves
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise SystemExit(f"radixd serve did not start ({' '.join(cmd)}):\n{tail}")
            time.sleep(0.1)
        self.address = f"127.0.0.1:{json.loads(ready.read_text())['port']}"

    def stop(self) -> None:
        """End the daemon (SIGTERM, then SIGKILL after 60 s) and remove its files."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
