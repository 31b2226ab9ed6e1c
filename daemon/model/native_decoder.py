"""A float32 or w4a8 step's layers in one native call (`radixd_decoder_forward`, kernels/cpu_decoder.c).

Where every projection is an `F32Linear` and the attention is the compiled row kernel, `NativeDecoder`
runs the step's layers and final norm in C with the same kernels (not ~120 torch ops a layer).
`RADIXD_CPU_DECODER` = `native` | `torch` | `auto` (default: native where it runs; `native` where it
cannot run is an error). NOTE: row-invariant (cpu_decoder.c): a token's hidden state is bitwise the same
whatever else the step holds. Close to the torch path's numbers, not bitwise (RMSNorm's sum and SiLU's
exp run in their own orders).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixd.daemon.model.f32 import F32Linear, library
from radixd.daemon.model.quant import QuantLinear
from radixd.kernels import cpu_attention
from radixd.kernels.native import DType, Layer, Step

ENV_DECODER = "RADIXD_CPU_DECODER"
CHOICES = ("auto", "native", "torch")
# The pools the step stores into and attends over.
POOL_DTYPES = {torch.float32: DType.F32, torch.float16: DType.F16}


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
    qkv: F32Linear | QuantLinear
    o_proj: F32Linear | QuantLinear
    gate_up: F32Linear | QuantLinear
    down: F32Linear | QuantLinear


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
        self._pools: tuple[tuple[int, ...], ctypes.Array[Layer]] | None = None

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
    ) -> ctypes.Array[Layer]:
        """The layers' descriptors over these pools (kept while the same pools come back: one runner's)."""
        key = tuple(t.data_ptr() for t in (*k_caches, *v_caches))
        if self._pools is None or self._pools[0] != key:
            arr = (Layer * len(self._layers))()
            for i, (lw, kc, vc) in enumerate(zip(self._layers, k_caches, v_caches, strict=True)):
                if not (kc.is_contiguous() and vc.is_contiguous() and vc.dtype == kc.dtype):
                    raise ValueError("the KV pools must be contiguous and of one dtype")
                arr[i] = Layer(
                    lw.attn_norm.data_ptr(),
                    lw.mlp_norm.data_ptr(),
                    lw.qkv.gemm.proj,
                    lw.o_proj.gemm.proj,
                    lw.gate_up.gemm.proj,
                    lw.down.gemm.proj,
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
        step = Step(
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
            layers,
            len(self._layers),
            self._norm.data_ptr(),
            ctypes.byref(step),
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
    lib = library() if fits else None
    if lib is None:
        if want == "native":
            raise RuntimeError(
                f"{ENV_DECODER}=native but the float32 decoder does not run for this model here"
            )
        return None
    return NativeDecoder(layers, final_norm, shape, eps, scale, lib)
