"""The native CPU kernels: this package's C files, built into one library per machine and loaded here.

``radixd.h`` declares every entry point, struct and enum; this module mirrors them in ctypes (checked by
tests/kernels/test_header.py). :func:`library` compiles each C file as its own unit (:data:`CFLAGS` plus
:data:`UNIT_FLAGS`' ISA flags) into radixd's cache directory, keyed by the sources, header, flags,
compiler, OpenMP runtime and CPU flags, and loads it with ctypes (the GIL released during a call); where
it cannot build, it warns once and returns None, and every caller runs its torch fallback.

NOTE: the library links the OpenMP runtime torch loaded (same soname), so a kernel's ``omp parallel``
shares torch's thread pool instead of starting a second one.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

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
    NOTE: every thread that ever opened a parallel region keeps its workers, and libgomp's waiting workers
    spin ~100 times, not ~300,000, once it manages more threads than CPUs: a model loaded on one thread
    and run on another (the engine thread) doubles the workers, and on a small machine each parallel
    region of a step then wakes its worker through the kernel."""
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


# NOTE: -ffp-contract=off and no -ffast-math are part of every kernel's row-invariance argument (each
# expression rounds as written, e.g. a Q4_1 weight's (d * q) + m as the GGUF reader's numpy rounds it);
# -O3 unrolls the tiles' loops over constant row and output counts so their accumulators stay in
# registers; -march=native picks the CPU's vector path (FMA, F16C) for every unit alike.
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-std=c11")
_X86 = platform.machine() in ("x86_64", "AMD64")
_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512_VNNI = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
# Per-file ISA flags, x86-64 only (elsewhere those units stay out and their callers fall back). They
# let a unit's intrinsics compile on any x86-64 CPU; its callers run it only where the CPU has the
# ISA (f32.py checks AVX2, FMA and F16C; a8_gemm.c and legacy_gemm.c check AVX512-VNNI before calling
# a8_avx512.c and legacy_avx512.c; kquant_x16.c and legacy_x16.c check it themselves), and there
# -march=native already enables the same features, so the code is the same.
UNIT_FLAGS: dict[str, tuple[str, ...]] = {
    "f32_gemm.c": _AVX2,
    "a8_gemm.c": _AVX2,
    "a8_avx512.c": _AVX512_VNNI,
    "legacy_gemm.c": _AVX2,
    "legacy_avx512.c": _AVX512_VNNI,
    "kquant_gemm.c": _AVX2,
    "kquant_x16.c": _AVX512_VNNI,
    "legacy_x16.c": _AVX512_VNNI,
    "cpu_decoder.c": _AVX2,
}
# What runs instead where the library cannot be built.
_FALLBACKS = "the CPU attention runs the split design, projections and float32 steps run in torch"


def _units() -> list[Path]:
    """The C files this machine builds: all of them on x86-64, elsewhere those without ISA flags."""
    return [p for p in sorted(_HERE.glob("*.c")) if _X86 or p.name not in UNIT_FLAGS]


def build_key(cc: str) -> str:
    """What a build depends on, hashed: every unit with its flags, every header, the common flags, the
    compiler, the OpenMP runtime and the CPU's flags."""
    ident = [f"{p.name}\0{UNIT_FLAGS.get(p.name, ())}".encode() + p.read_bytes() for p in _units()]
    ident += [p.name.encode() + p.read_bytes() for p in sorted(_HERE.glob("*.h"))]
    ident += [" ".join(CFLAGS).encode(), cc.encode(), str(_omp_runtime()).encode()]
    ident.append(" ".join(sorted(cpu_flags())).encode())
    return hashlib.sha256(b"\0".join(ident)).hexdigest()[:16]


def _build() -> Path | str:
    """The built library's path, or why it could not be built."""
    cc = _compiler()
    if cc is None:
        return "no C compiler (cc, gcc or $CC) on PATH"
    omp = _omp_runtime()
    units = _units()
    target = cache_root() / "kernels" / f"radixd-{build_key(cc)}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            objs = [Path(tmp) / f"{p.stem}.o" for p in units]
            jobs = [
                subprocess.Popen(
                    [cc, *CFLAGS, *UNIT_FLAGS.get(p.name, ()), "-fPIC", "-c", str(p), "-o", str(o)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                for p, o in zip(units, objs, strict=True)
            ]
            errors = [job.communicate()[1] for job in jobs]  # every compile ends before the folder goes
            for job, stderr in zip(jobs, errors, strict=True):
                if job.returncode:
                    raise subprocess.CalledProcessError(job.returncode, job.args, stderr=stderr)
            so = Path(tmp) / "radixd.so"
            link = [cc, "-shared", *map(str, objs), "-o", str(so)] + ([omp] if omp else ["-fopenmp"])
            subprocess.run(link, check=True, capture_output=True)
            os.replace(so, target)  # atomic: concurrent builders leave one complete file
    except subprocess.CalledProcessError as e:
        err: bytes = e.stderr
        return err.decode(errors="replace")[-2000:]
    except OSError as e:
        return str(e)
    return target


# ---- radixd.h in ctypes --------------------------------------------------------------------------

_i64, _i32, _f32, _p = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


class DType(enum.IntEnum):
    """radixd_dtype: the KV pools' and the attention's query and output element types."""

    F32 = 0
    BF16 = 1
    F16 = 2


class Weights(enum.IntEnum):
    """radixd_weights: how a projection's weights are stored."""

    F32 = 0
    Q4_1 = 1
    Q8_0 = 2
    Q4_1_A8 = 3
    Q8_0_A8 = 4
    Q4_0_A8 = 5
    Q5_0_A8 = 6
    Q5_1_A8 = 7
    Q4_K_A8 = 8
    Q5_K_A8 = 9
    Q6_K_A8 = 10
    F16 = 11
    BF16 = 12
    Q4_K_X16 = 13
    Q6_K_X16 = 14
    Q4_1_X16 = 15
    Q8_0_X16 = 16
    Q5_0_X16 = 17
    Q4_0_X16 = 18
    Q5_1_X16 = 19
    Q5_K_X16 = 20


class Attn(ctypes.Structure):
    """radixd_attn: one attention call."""

    _fields_ = [
        ("q", _p),
        ("out", _p),
        ("k", _p),
        ("v", _p),
        ("tables", _p),
        ("row_table", _p),
        ("row_pos", _p),
        *((name, _i64) for name in ("rows", "block_size", "hkv", "group", "d", "width", "window")),
        ("scale", _f32),
        ("io_dtype", _i32),
        ("dtype", _i32),
    ]


class Proj(ctypes.Structure):
    """radixd_proj: one projection's weights, or one part of them (`next`: the next part or None)."""


Proj._fields_ = [
    ("kind", _i64),
    ("w", _p),
    ("d", _p),
    ("mn", _p),
    ("bias", _p),
    ("n", _i64),
    ("k", _i64),
    ("next", ctypes.POINTER(Proj)),
]


class Layer(ctypes.Structure):
    """radixd_layer: one decoder layer."""

    _fields_ = [
        *(
            (name, _p)
            for name in ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")
        ),
        ("qkv", Proj),
        ("o", Proj),
        ("gate_up", Proj),
        ("down", Proj),
        ("k_cache", _p),
        ("v_cache", _p),
        ("window", _i64),
        ("rope", _i32),
        ("group", _i32),
        ("gelu", _i32),
    ]


class Step(ctypes.Structure):
    """radixd_step: a decoder step's rows."""

    _fields_ = [
        *(
            (name, _i64)
            for name in ("rows", "hidden", "hq", "hkv", "d", "inter", "block_size", "width", "num_tables")
        ),
        ("eps", _f32),
        ("scale", _f32),
        ("threads", _i32),
        ("attn_threads", _i32),
        ("kv_dtype", _i32),
        *((name, _p) for name in ("cos", "sin", "slots", "tables", "row_table", "row_pos")),
    ]


_c_int = ctypes.c_int
# name -> (restype, argtypes) of every entry point radixd.h declares.
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "radixd_attend_rows": (_c_int, [ctypes.POINTER(Attn), _c_int]),
    "radixd_gemm": (_c_int, [ctypes.POINTER(Proj), _p, _i64, _p, _c_int]),
    "radixd_dequantize_rows": (_c_int, [ctypes.POINTER(Proj), _p, _i64, _p]),
    "radixd_q4_1_encode": (_c_int, [_p, _i64, _i64, _p, _p, _p]),
    "radixd_q8_0_encode": (_c_int, [_p, _i64, _i64, _p, _p]),
    "radixd_kquant_repack": (_c_int, [_i64, _p, _i64, _i64, _p]),
    "radixd_kquant_repacked_bytes": (_i64, [_i64, _i64, _i64]),
    "radixd_legacy_repack": (_c_int, [_i64, _p, _i64, _i64, _p]),
    "radixd_legacy_repacked_bytes": (_i64, [_i64, _i64, _i64]),
    "radixd_decoder_workspace": (_i64, [_i64] * 6),
    "radixd_decoder_forward": (_c_int, [ctypes.POINTER(Layer), _i64, _p, ctypes.POINTER(Step), _p, _p, _p]),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, its entry points typed (those this machine built: see `UNIT_FLAGS`); None,
    with a warning, where it cannot be built or loaded."""
    built = _build()
    if isinstance(built, Path):
        try:
            lib = ctypes.CDLL(str(built))
        except OSError as e:
            built = str(e)
        else:
            for name, (restype, argtypes) in SIGNATURES.items():
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype, fn.argtypes = restype, argtypes
            return lib
    warnings.warn(f"building the native kernels failed, {_FALLBACKS}: {built}", RuntimeWarning, stacklevel=2)
    return None
