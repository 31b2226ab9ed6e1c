"""Kernel-test fixtures: run Triton kernels on CPU under the interpreter, per test.

Triton reads TRITON_INTERPRET when a kernel is decorated; radixd.kernels decorates lazily, at the
first launch in each mode, so setting the variable for the duration of a test is enough and works
whether or not it was already set for the whole run. It is not set globally, so other test packages
keep their own backend choice.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the test with TRITON_INTERPRET=1 (restored afterwards)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    yield


@pytest.fixture(params=["torch", "triton"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both implementations of an op; the Triton one under the interpreter."""
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    if request.param == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return str(request.param)
