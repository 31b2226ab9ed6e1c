"""A float32 or w4a8 step's layers in one compiled call (kernels/cpu_decoder.c) instead of ~120 torch
operations a layer.

At batch 1 the layer-by-layer path (`LlamaModel.forward`'s torch loop) spends as long dispatching its
small operations (norms, rotary, KV store, SiLU, residual adds, views) as the projections take to stream
the weights. Where every projection is an `F32Linear` (float32 or w4a8 on an x86-64 CPU with AVX2) and the
attention is the compiled row kernel, `NativeDecoder` runs the whole step's layers and the final norm
in C with the same projection and attention kernels, so the step is the weight stream plus the
attention and little else.

`RADIXD_CPU_DECODER` = `native` | `torch` | `auto` (default: native where it runs, else torch) chooses;
`native` where it cannot run is an error, `torch` keeps the layer-by-layer path (benchmarks' A/B).

NOTE: row-invariant (cpu_decoder.c): a token's hidden state is bitwise the same whatever else the step
holds, so the batch-invariance contract holds on this path as on the torch one. Its numbers are close
to the torch path's, not bitwise (RMSNorm's sum and SiLU's exp are computed in their own orders).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixd.daemon.model.f32 import FLAGS as F32_FLAGS
from radixd.daemon.model.f32 import F32Linear
from radixd.daemon.model.f32 import library as f32_library
from radixd.kernels import cpu_attention
from radixd.kernels.native import load

ENV_DECODER = "RADIXD_CPU_DECODER"
CHOICES = ("auto", "native", "torch")
_SOURCE = "cpu_decoder.c"
# The pools the step stores into and attends over (cpu_attention.c's DT_F32, DT_F16).
POOL_DTYPES = {torch.float32: 0, torch.float16: 2}

_i64, _f32, _i32, _p = ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_void_p


class _Proj(ctypes.Structure):
    _fields_ = [("kind", _i64), ("w", _p), ("d", _p), ("mn", _p), ("bias", _p), ("n", _i64), ("k", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", _p),
        ("mlp_norm", _p),
        ("qkv", _Proj),
        ("o", _Proj),
        ("gate_up", _Proj),
        ("down", _Proj),
        ("k_cache", _p),
        ("v_cache", _p),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        *((name, _i64) for name in ("rows", "hidden", "hq", "hkv", "d", "inter", "block_size", "width")),
        ("eps", _f32),
        ("scale", _f32),
        ("threads", _i32),
        ("attn_threads", _i32),
        ("kv_dtype", _i32),
        *((name, _p) for name in ("cos", "sin", "slots", "tables", "row_table", "row_pos")),
    ]


@functools.cache
def _library() -> ctypes.CDLL | None:
    if f32_library() is None:  # the same CPU and compiler requirements as the projections
        return None
    # f32.py's flags: cpu_attention.c relies on their -ffp-contract=off and -fno-fast-math too
    lib = load(_SOURCE, F32_FLAGS, "float32 steps run layer by layer in torch")
    if lib is None:
        return None
    lib.radixd_decoder_workspace.argtypes = [_i64] * 6
    lib.radixd_decoder_workspace.restype = _i64
    lib.radixd_decoder_forward.argtypes = [_p, _i64, _p, _p, _p, _p, _p]
    lib.radixd_decoder_forward.restype = ctypes.c_int
    return lib


def choice() -> str:
    """`RADIXD_CPU_DECODER`, checked: "auto", "native" or "torch"."""
    name = os.environ.get(ENV_DECODER, "auto").strip().lower() or "auto"
    if name not in CHOICES:
        raise ValueError(f"unknown {ENV_DECODER}={name!r}: use one of {CHOICES}")
    return name


@dataclass(frozen=True)
class DecoderLayer:
    """One layer as the decoder runs it: its norms' weights and its four projections."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: F32Linear
    o_proj: F32Linear
    gate_up: F32Linear
    down: F32Linear


def _proj(op: F32Linear) -> _Proj:
    kind, w, d, mn = op.source()
    out_f, in_f = op.weight.shape
    bias = 0 if op.bias is None else op.bias.data_ptr()
    return _Proj(kind, w, d, mn, bias, out_f, in_f)


class NativeDecoder:
    """Runs a float32 step's layers and final norm in one call (module docstring). Build it with
    `native_decoder`, which returns None where it cannot run."""

    def __init__(
        self,
        layers: Sequence[DecoderLayer],
        final_norm: torch.Tensor,
        shape: tuple[int, int, int, int, int],
        eps: float,
        scale: float,
        lib: ctypes.CDLL,
    ) -> None:
        self.hidden, self.hq, self.hkv, self.d, self.inter = shape
        self._layers = list(layers)
        self._norm = final_norm
        self._eps, self._scale, self._lib = eps, scale, lib
        self._work = torch.empty(0)
        self._pools: tuple[tuple[int, ...], ctypes.Array[_Layer]] | None = None

    def takes(self, k_cache: torch.Tensor) -> bool:
        """Whether pools like `k_cache` run here: contiguous float32 or float16 on the CPU, with the
        compiled attention in force (else the torch path runs, with whichever attention design is)."""
        return (
            k_cache.dtype in POOL_DTYPES
            and k_cache.device.type == "cpu"
            and cpu_attention.use_compiled(k_cache, self.hq // self.hkv)
        )

    def _layer_array(
        self, k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor]
    ) -> ctypes.Array[_Layer]:
        """The layers' descriptors over these pools (kept while the same pools come back: one runner's)."""
        key = tuple(t.data_ptr() for t in (*k_caches, *v_caches))
        if self._pools is None or self._pools[0] != key:
            arr = (_Layer * len(self._layers))()
            for i, (lw, kc, vc) in enumerate(zip(self._layers, k_caches, v_caches, strict=True)):
                if not (kc.is_contiguous() and vc.is_contiguous() and vc.dtype == kc.dtype):
                    raise ValueError("the KV pools must be contiguous and of one dtype")
                arr[i] = _Layer(
                    lw.attn_norm.data_ptr(),
                    lw.mlp_norm.data_ptr(),
                    _proj(lw.qkv),
                    _proj(lw.o_proj),
                    _proj(lw.gate_up),
                    _proj(lw.down),
                    kc.data_ptr(),
                    vc.data_ptr(),
                )
            self._pools = (key, arr)
        return self._pools[1]

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        plan: cpu_attention.RowsPlan,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """h: the embeddings [T, H] float32 (overwritten: the residual stream); cos, sin: rope.py's
        [T, 1, D] tables; slots: int64 [T] (-1 stores nothing); plan: the T rows' attention
        (`cpu_attention.plan_rows`, which checked every table entry). -> final-normed hidden [T, H]."""
        t = h.shape[0]
        kc = k_caches[0]
        n_blocks, block_size = kc.shape[0], kc.shape[1]
        if slots.shape[0] != t or plan.row_pos.shape[0] != t:
            raise ValueError(
                f"the decoder got {t} rows, {slots.shape[0]} slots and {plan.row_pos.shape[0]} plan rows"
            )
        if t and (int(slots.min()) < -1 or int(slots.max()) >= n_blocks * block_size):
            raise ValueError(f"slot_mapping entries must lie in [-1, {n_blocks * block_size})")
        out = torch.empty_like(h)
        if t == 0:
            return out
        need = self._lib.radixd_decoder_workspace(t, self.hidden, self.hq, self.hkv, self.d, self.inter)
        if self._work.numel() < need:
            self._work = torch.empty(need)
        cos_c, sin_c = cos.contiguous(), sin.contiguous()
        slots_c = slots.to(torch.int64).contiguous()
        step = _Step(
            t,
            self.hidden,
            self.hq,
            self.hkv,
            self.d,
            self.inter,
            block_size,
            plan.tables.shape[1],
            self._eps,
            self._scale,
            torch.get_num_threads(),
            cpu_attention.threads_for(plan, self.hkv),
            POOL_DTYPES[k_caches[0].dtype],
            cos_c.data_ptr(),
            sin_c.data_ptr(),
            slots_c.data_ptr(),
            plan.tables.data_ptr(),
            plan.row_table.data_ptr(),
            plan.row_pos.data_ptr(),
        )
        layers = self._layer_array(k_caches, v_caches)
        rc = self._lib.radixd_decoder_forward(
            ctypes.addressof(layers),
            len(self._layers),
            self._norm.data_ptr(),
            ctypes.addressof(step),
            h.data_ptr(),
            out.data_ptr(),
            self._work.data_ptr(),
        )
        if rc:
            raise MemoryError("the native decoder could not allocate a kernel's buffers")
        return out


def native_decoder(
    layers: Sequence[DecoderLayer],
    final_norm: torch.Tensor,
    shape: tuple[int, int, int, int, int],
    eps: float,
    scale: float,
) -> NativeDecoder | None:
    """The decoder over these layers (`shape`: hidden, q heads, kv heads, head dim, intermediate), or
    None where it does not run: `RADIXD_CPU_DECODER=torch`, a dimension not a multiple of 8, a weight
    not float32 on the CPU, or no compiled library (then `native` raises RuntimeError)."""
    want = choice()
    if want == "torch":
        return None
    hidden, hq, hkv, d, inter = shape
    tensors = [final_norm, *(t for lw in layers for t in (lw.attn_norm, lw.mlp_norm))]
    fits = (
        all(n % 8 == 0 for n in (hidden, d, inter))
        and hkv > 0
        and hq % hkv == 0
        and all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors)
    )
    lib = _library() if fits else None
    if lib is None:
        if want == "native":
            raise RuntimeError(
                f"{ENV_DECODER}=native but the float32 decoder does not run for this model here"
            )
        return None
    return NativeDecoder(layers, final_norm, shape, eps, scale, lib)
