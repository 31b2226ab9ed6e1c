"""kernels/native.py: the OpenMP hand-over (the loading thread's workers go when the engine thread takes
over, and kernels keep computing the same results afterwards), and the fallback where the library
cannot be built."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

import radixd.kernels.native as native
from radixd.daemon.model import f32
from radixd.daemon.model.f32 import F32Linear
from radixd.kernels import cpu_attention
from radixd.kernels.native import _omp_runtime, release_openmp_workers


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_the_calling_threads_workers_go_and_kernels_still_compute() -> None:
    lin = F32Linear(torch.randn(256, 128), None)
    x = torch.randn(4, 128)
    before = lin(x)  # opens a parallel region on this thread: its workers start (or stay)
    with_workers = _threads()
    assert release_openmp_workers() == (_omp_runtime() is not None)
    if _omp_runtime() is not None and torch.get_num_threads() > 1:
        deadline = time.monotonic() + 5.0
        while _threads() >= with_workers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _threads() < with_workers  # the workers exited
    got: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: got.append(lin(x)))
    worker.start()
    worker.join()
    assert torch.equal(got[0], before)  # another thread computes the same bits
    assert torch.equal(lin(x), before)  # and this one again, its workers started anew


def test_without_a_compiler_it_warns_and_every_caller_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that fails every unit
    monkeypatch.setenv("RADIXD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(cpu_attention.ENV_DESIGN, raising=False)
    native.library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="split design"):
            assert native.library() is None
        assert cpu_attention.design() == "split"
        assert f32.library() is None and not f32.f32_available()
    finally:
        native.library.cache_clear()  # the next caller loads the machine's own build again


def test_the_build_key_covers_every_source_and_header(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for f in [*native._HERE.glob("*.c"), *native._HERE.glob("*.h")]:
        (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(native, "_HERE", tmp_path)
    keys = {native.build_key("cc")}
    for name in ("radixd.h", "vec8.h", "cpu_attention.c", "a8_avx512.c"):
        with open(tmp_path / name, "a") as f:
            f.write("\n")
        keys.add(native.build_key("cc"))
    (tmp_path / "new_kernel.c").write_text("int radixd_new(void) { return 0; }\n")
    keys.add(native.build_key("cc"))
    assert len(keys) == 6
