"""kernels/native.py's OpenMP hand-over: the loading thread's workers go when the engine thread takes
over (release_openmp_workers), and kernels keep computing the same results afterwards."""

from __future__ import annotations

import os
import threading
import time

import torch

from radixd.daemon.model.f32 import F32Linear
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
