"""Kernel-test fixtures: run Triton kernels on CPU under the interpreter, per test.

Triton reads TRITON_INTERPRET when a kernel is decorated; radixd.kernels decorates lazily, at the
first launch in each mode, so setting the variable for the duration of a test is enough and works
whether or not it was already set for the whole run. It is not set globally, so other test packages
keep their own backend choice.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import triton.language as tl

_MISSING = object()


@pytest.fixture(autouse=True)
def _triton_language_restored() -> Iterator[None]:
    """Every kernel test leaves `triton.language` as it found it.

    NOTE: Triton's interpreter patches `triton.language` for each launch and restores it afterwards,
    except (Triton 3.9) where an interpreted kernel calls another `@triton.jit` function: those
    patches stay for the rest of the process, and a later real compile (test_compile_sm90.py) then
    runs the interpreter's builder and fails."""
    spaces = [tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base]
    saved = [dict(vars(ns)) for ns in spaces]
    yield
    for ns, before in zip(spaces, saved, strict=True):
        now = dict(vars(ns))
        for name in now.keys() - before.keys():
            delattr(ns, name)
        for name, value in before.items():
            if now.get(name, _MISSING) is not value:
                setattr(ns, name, value)


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
