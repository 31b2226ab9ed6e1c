"""Backend selection shared by every op: one rule, so the model and the tests agree on what runs.

An explicit ``backend`` argument wins; else ``RADIXD_KERNEL_BACKEND`` ("triton" | "torch"); else
"triton" for CUDA tensors, or under ``TRITON_INTERPRET=1`` (CPU tests of the Triton kernels); else
"torch" (the daemon's CPU path). Triton fixes at *decoration* time whether a ``@triton.jit`` function is
compiled or interpreted, so a module-level decorator would freeze the mode at import: :class:`LazyKernel`
decorates at first launch and keeps a compiled and an interpreted variant, chosen per launch (an
interpreted launch swaps in the twins of the ``@triton.jit`` helpers in tiles.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

try:  # triton is a hard dependency, but keep the torch path importable without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

__all__ = [
    "BACKENDS",
    "ENV_BACKEND",
    "LazyKernel",
    "check_same_device",
    "host_kernels",
    "interpreting",
    "resolve_backend",
    "tl",
    "triton",
]

BACKENDS = ("triton", "torch")
ENV_BACKEND = "RADIXD_KERNEL_BACKEND"


def interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    import triton

    knobs = getattr(triton, "knobs", None)  # NOTE: triton < 3.4 has no knobs; the env var is the truth there
    if knobs is not None and bool(knobs.runtime.interpret):
        return True
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return "triton" or "torch" for an op whose tensors live on ``device``. Raises ValueError for an
    unknown name, and for "triton" on CPU tensors outside the interpreter (it cannot read host memory)."""
    name = _chosen(backend, device)
    if name not in BACKENDS:
        raise ValueError(
            f"unknown kernel backend {name!r}: use one of {BACKENDS} (argument or env {ENV_BACKEND})"
        )
    if name == "triton" and device.type != "cuda" and not interpreting():
        raise ValueError(
            f"backend 'triton' needs CUDA tensors (got {device}); set TRITON_INTERPRET=1 to run the "
            "kernels on CPU under the Triton interpreter, or use backend='torch'"
        )
    return name


def _chosen(backend: str | None, device: torch.device) -> str:
    """The rule of the module docstring, unchecked."""
    if backend is not None:
        return backend
    name = os.environ.get(ENV_BACKEND, "").strip().lower()
    return name or ("triton" if device.type == "cuda" or interpreting() else "torch")


def host_kernels(device: torch.device | str) -> bool:
    """Whether work on ``device`` runs the CPU-only pieces: the native library (compiled GEMMs, the
    float32 decoder, the compiled CPU attention), its OpenMP threads and 2 MiB-page pools.

    NOTE: the one decision between the two paths. True for CPU tensors unless the Triton kernels run
    there under the interpreter; CUDA, and that interpreter, take the path a GPU runs, which touches
    none of those pieces (tests/daemon/engine/test_engine_triton.py)."""
    dev = torch.device(device)
    return dev.type == "cpu" and not (interpreting() and _chosen(None, dev) == "triton")


class LazyKernel:
    """A Triton kernel decorated on first launch, in the mode (compiled/interpreted) of that launch:
    ``_kernel = LazyKernel(_kernel_fn)``, then ``_kernel[grid](args...)``."""

    def __init__(self, fn: Callable[..., None], do_not_specialize: tuple[str, ...] = ()) -> None:
        self.fn = fn
        # NOTE: integer arguments that vary from call to call (table widths, split counts) are not
        # specialized on value/divisibility, so they do not trigger a recompile each time they change.
        self.do_not_specialize = do_not_specialize
        self._variants: dict[bool, Any] = {}

    def __getitem__(self, grid: Any) -> Any:
        mode = interpreting()
        kernel = self._variants.get(mode)
        if kernel is None:
            kernel = self._decorate(mode)
            self._variants[mode] = kernel
        launch = kernel[grid]
        if not mode:
            return launch

        def interpreted_launch(*args: Any, **kwargs: Any) -> Any:
            with _interpretable(self.fn.__globals__):
                return launch(*args, **kwargs)

        return interpreted_launch

    def _decorate(self, interpret: bool) -> Any:
        import triton

        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            return InterpretedFunction(self.fn)
        return triton.jit(self.fn, do_not_specialize=list(self.do_not_specialize))


_TWINS: dict[int, Any] = {}


@contextlib.contextmanager
def _interpretable(kernel_globals: dict[str, Any]) -> Iterator[None]:
    """Let the interpreter call the @jit helpers of triton.language (tl.max, tl.sum, ...) and of the
    kernel's module (tiles.py's): decorated at import without TRITON_INTERPRET, they are compiled-mode
    JITFunctions the interpreter refuses, so an interpreted launch swaps in interpreted twins meanwhile."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    spaces = [vars(mod) for mod in (tl, tl.standard, tl.math, tl.core)] + [kernel_globals]
    saved: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for space in spaces:
            for name, value in list(space.items()):
                if isinstance(value, JITFunction):
                    twin = _TWINS.get(id(value))
                    if twin is None:
                        twin = InterpretedFunction(value.fn)
                        _TWINS[id(value)] = twin
                    saved.append((space, name, value))
                    space[name] = twin
        yield
    finally:
        for space, name, value in reversed(saved):
            space[name] = value


def check_same_device(what: str, *tensors: torch.Tensor) -> torch.device:
    """Return the common device of ``tensors`` or raise ValueError naming ``what``."""
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            raise ValueError(f"{what}: all tensors must be on one device, got {dev} and {t.device}")
    return dev
