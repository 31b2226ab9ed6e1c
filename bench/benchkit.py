"""What the benchmarks share: a `radixd serve` subprocess on free loopback ports, the model's tokenizer
and config without building the model, and the daemon internals the benchmarks drive.

The benchmarks import daemon internals from here only, so a module that moves inside the daemon is one
edit in this file. Scripts run as `python bench/NAME.py`: Python puts bench/ first on the import path,
so `import benchkit` needs nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import radixd.daemon.runner as runner_module
from radixd.daemon.engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_GB, EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.factory import build_core, build_engine
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.types import GenerateRequest, RequestOutput, Sink
from radixd.daemon.host import startup_heap_frozen, zeros_on_huge_pages
from radixd.daemon.loaders import LoadedModel, convert, default_model_path, load_model
from radixd.daemon.loaders.common import ConvertedModel
from radixd.daemon.log import configure
from radixd.daemon.model import AttentionMetadata, ModelConfig
from radixd.daemon.model.native_decoder import ENV_DECODER
from radixd.daemon.model.precision import default_dtype_name
from radixd.daemon.quality import QualityReport, reference_log_probs, teacher_forced_quality
from radixd.daemon.runner import ModelRunner, StepResult, StepSeq, num_blocks_for_budget
from radixd.daemon.sampling import SampleResult, SamplingParams, SamplingState
from radixd.daemon.server.bounds import prompt_char_bound
from radixd.daemon.server.bridge import OutputBridge
from radixd.daemon.server.state import Limits

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_KV_CACHE_GB",
    "ENV_DECODER",
    "AttentionMetadata",
    "Daemon",
    "EngineConfig",
    "EngineCore",
    "GenerateRequest",
    "KVManager",
    "Limits",
    "LoadedModel",
    "ModelConfig",
    "ModelRunner",
    "OutputBridge",
    "QualityReport",
    "RequestOutput",
    "SampleResult",
    "SamplingParams",
    "SamplingState",
    "Sink",
    "StepResult",
    "StepSeq",
    "build_core",
    "build_engine",
    "configure",
    "default_dtype_name",
    "default_model_path",
    "load_model",
    "model_files",
    "num_blocks_for_budget",
    "prompt_char_bound",
    "reference_log_probs",
    "runner_module",
    "startup_heap_frozen",
    "teacher_forced_quality",
    "zeros_on_huge_pages",
]


def model_files(path: str | None = None) -> ConvertedModel:
    """The model's tokenizer, config and weights as loaded from its file (default: the embedded
    SmolLM2), without building the model: for benchmarks that need its vocabulary, not its forward."""
    return convert(path or default_model_path())


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
