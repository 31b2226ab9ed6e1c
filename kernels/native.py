"""Native CPU kernels: C sources in this package, compiled once per machine with the system's C compiler.

Torch has no CPU kernel for some of what radixd runs (a row-invariant paged attention, row-invariant fp32
projections over GGUF blocks, a float32 step's layers in one call); those are small C files beside
this module (``cpu_attention.c``, ``f32_gemm.c``, ``a8_gemm.c`` and ``cpu_decoder.c``, which includes
the others).
:func:`load` compiles one into radixd's cache directory the first time a process needs it (keyed by
the source and the sources it includes, the flags, the compiler, the OpenMP runtime and the CPU's
flags, so a changed source or another machine builds anew) and loads it with ctypes, which releases the GIL
during a call as torch's own kernels do.

NOTE: every library links the OpenMP runtime torch itself loaded (same soname), so a kernel's
``omp parallel`` shares torch's thread pool instead of starting a second one beside it.

Where a library cannot be built (no compiler, a compile error), :func:`load` warns and returns None,
and its caller runs its torch fallback.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

_HERE = Path(__file__).parent


def cache_root() -> Path:
    """radixd's cache directory (converted weights, built kernels): $RADIXD_CACHE_DIR, else
    $XDG_CACHE_HOME/radixd, else ~/.cache/radixd."""
    env = os.environ.get("RADIXD_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "radixd" if xdg else Path.home() / ".cache" / "radixd"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux's /proc/cpuinfo; empty where unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _omp_runtime() -> str | None:
    """The OpenMP runtime torch ships (None: link the compiler's own)."""
    lib = Path(torch.__file__).parent / "lib"
    for name in ("libgomp.so.1", "libiomp5.so"):
        if (lib / name).exists():
            return str(lib / name)
    return None


def release_openmp_workers() -> bool:
    """Stop the OpenMP worker threads the calling thread started (OpenMP 5's `omp_pause_resource_all`);
    True where the runtime did. Call it from a thread that stops computing, before another takes over.

    NOTE: libgomp lets its waiting workers spin only ~100 times, instead of ~300,000, once it manages
    more threads than there are CPUs, and every thread that ever opened a parallel region keeps its
    workers. A model loaded on one thread and run on another (the engine thread) therefore doubles
    the workers, and on a 2-core machine each of a step's ~200 parallel regions then wakes its worker
    through the kernel: a batch-1 step took 17 ms instead of 10 (bench/serve_step.py)."""
    path = _omp_runtime()
    try:
        lib = ctypes.CDLL(path or "libgomp.so.1")
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):
        return False
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int
    return bool(pause(1) == 0)  # omp_pause_soft: the runtime starts workers again when it needs them


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    return shutil.which(cc) if cc else shutil.which("cc") or shutil.which("gcc")


def _sources(src: Path) -> list[bytes]:
    """The bytes of `src` and of every file of this package it includes (`#include "name"`), depth
    first: what a build depends on, so that a changed included source builds anew too."""
    text = src.read_bytes()
    out = [text]
    for name in re.findall(rb'^\s*#\s*include\s+"([^"]+)"', text, flags=re.MULTILINE):
        out += _sources(_HERE / name.decode())
    return out


@functools.cache
def _build(source: str, cflags: tuple[str, ...]) -> Path | str:
    """The built library's path, or why it could not be built."""
    cc = _compiler()
    if cc is None:
        return "no C compiler (cc, gcc or $CC) on PATH"
    src = _HERE / source
    omp = _omp_runtime()
    ident = [*_sources(src), " ".join(cflags).encode(), cc.encode(), str(omp).encode()]
    key = hashlib.sha256(b"\0".join([*ident, " ".join(sorted(cpu_flags())).encode()])).hexdigest()[:16]
    target = cache_root() / "kernels" / f"{src.stem}-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            obj, so = Path(tmp) / "k.o", Path(tmp) / "k.so"
            subprocess.run(
                [cc, *cflags, "-fPIC", "-c", str(src), "-o", str(obj)], check=True, capture_output=True
            )
            link = [cc, "-shared", str(obj), "-o", str(so)] + ([omp] if omp else ["-fopenmp"])
            subprocess.run(link, check=True, capture_output=True)
            os.replace(so, target)  # atomic: concurrent builders leave one complete file
    except subprocess.CalledProcessError as e:
        err: bytes = e.stderr
        return err.decode(errors="replace")[-2000:]
    except OSError as e:
        return str(e)
    return target


def load(source: str, cflags: Sequence[str], purpose: str) -> ctypes.CDLL | None:
    """The library built from ``source`` (a C file of this package) with ``cflags``; None, with a
    warning naming ``purpose`` (what runs instead), where it cannot be built or loaded."""
    built = _build(source, tuple(cflags))
    if isinstance(built, Path):
        try:
            return ctypes.CDLL(str(built))
        except OSError as e:
            built = str(e)
    warnings.warn(f"building {source} failed, {purpose}: {built}", RuntimeWarning, stacklevel=3)
    return None
