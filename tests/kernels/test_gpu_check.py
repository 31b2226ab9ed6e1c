"""bench/gpu_check.py must work on first real use: its dry run exercises every code path on CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def _load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import bench/gpu_check.py as a module (registered, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location("radixd_bench_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "radixd_bench_gpu_check", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_dry_run_writes_a_passing_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # restored after the test (main() sets it too)
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    module = _load(monkeypatch)
    rc = module.main(["--dry-run", "--out", str(tmp_path)])
    text = (tmp_path / "gpu-dry-run.md").read_text()
    assert rc == 0, text
    assert "## Correctness" in text and "## Decode bandwidth" in text and "## Decode tile sweep" in text
    # The engine served the tiny model on the Triton path: its fp32 tokens are the CPU path's.
    assert (
        "## Engine" in text
        and "| float32 | cpu (triton) | 12/12 " in text
        and "| float16 | cpu (triton) |" in text
    )
    assert "FAIL" not in text and "raised" not in text
    # The kernels' tile config is restored after the sweep.
    from radixd.kernels.paged_decode import DECODE_CONFIG

    assert DECODE_CONFIG == {"block_n": 64, "num_warps": 4, "num_stages": 2}


def test_gpu_check_refuses_cpu_without_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(monkeypatch)
    # Pretend there is no GPU, so the refusal is checked on every machine, GPU or not.
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert module.main([]) == 2


@pytest.mark.slow
def test_gpu_check_reruns_a_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--skip-engine, --skip-correctness and --models rerun only the named part (as after a hung run)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    module = _load(monkeypatch)
    rc = module.main(
        ["--dry-run", "--out", str(tmp_path), "--skip-engine", "--skip-correctness", "--models", "Llama-3-8B"]
    )
    text = (tmp_path / "gpu-dry-run.md").read_text()
    assert rc == 0, text
    assert "## Correctness" not in text and "## Engine" not in text
    assert "| Llama-3-8B |" in text and "| SmolLM2-135M |" not in text
    assert "--skip-engine --skip-correctness --models Llama-3-8B" in text
