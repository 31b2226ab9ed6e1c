"""A float32 or w4a8 step's layers in one native call (`radixd_decoder_forward`, kernels/cpu_decoder.c).

Where every projection is an `F32Linear` and the attention is the compiled row kernel, `NativeDecoder`
runs the step's layers and final norm in C with the same kernels (not ~120 torch ops a layer). A
layer's family options are data (`DecoderLayer`): QK-norm, post-attention / post-MLP norms, GeGLU,
its rotary table, its sliding window, and per step its KV group (kv_layout.py's windowed layout).
`RADIXD_CPU_DECODER` = `native` | `torch` | `auto` (default: native where it runs; `native` where it
cannot run is an error). NOTE: row-invariant (cpu_decoder.c): a token's hidden state is bitwise the same
whatever else the step holds. Close to the torch path's numbers, not bitwise (RMSNorm's sum and the
activations' exp run in their own orders).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixd.daemon.model.f32 import F32Linear, library
from radixd.daemon.model.layer import AttentionMetadata
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
    """One layer as the decoder runs it: its norms' weights, its four projections and its options
    (layer.py's `LayerWeights` and `run_layer`): the optional norms (None: none), a GELU-tanh gate
    (else SiLU), which of the step's rotary tables it rotates with, and its window (0: none)."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: F32Linear | QuantLinear
    o_proj: F32Linear | QuantLinear
    gate_up: F32Linear | QuantLinear
    down: F32Linear | QuantLinear
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None
    gelu: bool = False
    rope: int = 0
    window: int = 0

    def norms(self) -> list[torch.Tensor]:
        """Every norm weight the layer has."""
        opt = (self.q_norm, self.k_norm, self.post_attn_norm, self.post_mlp_norm)
        return [self.attn_norm, self.mlp_norm, *(t for t in opt if t is not None)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


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
        # The attention's thread count is sized by the widest window any layer sees (0: all keys).
        wins = [lw.window for lw in layers]
        self._attn_window = 0 if 0 in wins else max(wins)

    def takes(self, k_cache: torch.Tensor) -> bool:
        """Whether pools like `k_cache` run here: contiguous float32 or float16 on the CPU, with the
        compiled attention in force (else the torch path runs, with whichever attention design is)."""
        return (
            k_cache.dtype in POOL_DTYPES
            and k_cache.device.type == "cpu"
            and cpu_attention.use_compiled(k_cache, self.hq // self.hkv)
        )

    def _layer_array(
        self, k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor], groups: Sequence[int]
    ) -> ctypes.Array[Layer]:
        """The layers' descriptors over these pools and KV groups (kept while the same come back)."""
        key = (*(t.data_ptr() for t in (*k_caches, *v_caches)), *groups)
        if self._pools is None or self._pools[0] != key:
            arr = (Layer * len(self._layers))()
            for i, (lw, kc, vc, g) in enumerate(zip(self._layers, k_caches, v_caches, groups, strict=True)):
                if not (kc.is_contiguous() and vc.is_contiguous() and vc.dtype == kc.dtype):
                    raise ValueError("the KV pools must be contiguous and of one dtype")
                arr[i] = Layer(
                    lw.attn_norm.data_ptr(),
                    lw.mlp_norm.data_ptr(),
                    _ptr(lw.q_norm),
                    _ptr(lw.k_norm),
                    _ptr(lw.post_attn_norm),
                    _ptr(lw.post_mlp_norm),
                    lw.qkv.gemm.proj,
                    lw.o_proj.gemm.proj,
                    lw.gate_up.gemm.proj,
                    lw.down.gemm.proj,
                    kc.data_ptr(),
                    vc.data_ptr(),
                    lw.window,
                    lw.rope,
                    g,
                    int(lw.gelu),
                )
            self._pools = (key, arr)
        return self._pools[1]

    def forward(
        self,
        h: torch.Tensor,
        ropes: Sequence[tuple[torch.Tensor, torch.Tensor]],
        slots: Sequence[torch.Tensor],
        plan: cpu_attention.RowsPlan,
        tables: torch.Tensor,
        groups: Sequence[int],
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """h: the embeddings [T, H] float32 (overwritten: the residual stream); ropes: rope.py's
        [T, 1, D] (cos, sin) tables, a layer's `rope` indexing them; plan: the T rows' attention
        (`grouped_plan`); per KV group g: slots[g] int64 [T] (-1 stores nothing) and tables[g], its
        tables in the plan's order (int32 [G, plan's tables, W]); groups: each layer's KV group.
        -> final-normed hidden [T, H]."""
        t = h.shape[0]
        kc = k_caches[0]
        n_blocks, block_size = kc.shape[0], kc.shape[1]
        n_groups = len(slots)
        if tables.shape[:2] != (n_groups, plan.tables.shape[0]) or not groups or max(groups) >= n_groups:
            raise ValueError(
                f"the decoder got {n_groups} slot maps, tables {tuple(tables.shape)} for "
                f"{plan.tables.shape[0]} table rows, and layer groups {tuple(groups)}"
            )
        if min(lw.rope for lw in self._layers) < 0 or max(lw.rope for lw in self._layers) >= len(ropes):
            raise ValueError(f"the decoder got {len(ropes)} rotary tables for layers that read more")
        if plan.row_pos.shape[0] != t or any(sl.shape[0] != t for sl in slots):
            raise ValueError(
                f"the decoder got {t} rows, {plan.row_pos.shape[0]} plan rows and slot maps of {t}"
            )
        slots_c = torch.stack([sl.to(torch.int64) for sl in slots]).contiguous()
        tables = tables.to(torch.int32).contiguous()
        # NOTE: the C code follows these unchecked: every group's tables must hold the plan's rows.
        if t and (int(slots_c.min()) < -1 or int(slots_c.max()) >= n_blocks * block_size):
            raise ValueError(f"slot_mapping entries must lie in [-1, {n_blocks * block_size})")
        if tables.numel() and (int(tables.min()) < 0 or int(tables.max()) >= n_blocks):
            raise ValueError(f"block ids must lie in [0, {n_blocks})")
        if plan.block_size != block_size or (t and int(plan.row_pos.max()) >= tables.shape[2] * block_size):
            raise ValueError("the step's tables do not cover its rows' positions in these pools")
        out = torch.empty_like(h)
        if t == 0:
            return out
        need = self._lib.radixd_decoder_workspace(t, self.hidden, self.hq, self.hkv, self.d, self.inter)
        if self._work.numel() < need:
            self._work = torch.empty(need)
        cos_c = torch.stack([c.reshape(t, self.d) for c, _ in ropes]).contiguous()
        sin_c = torch.stack([s.reshape(t, self.d) for _, s in ropes]).contiguous()
        step = Step(
            t,
            self.hidden,
            self.hq,
            self.hkv,
            self.d,
            self.inter,
            block_size,
            tables.shape[2],
            tables.shape[1],
            self._eps,
            self._scale,
            torch.get_num_threads(),
            cpu_attention.threads_for(plan, self.hkv, self._attn_window),
            POOL_DTYPES[k_caches[0].dtype],
            cos_c.data_ptr(),
            sin_c.data_ptr(),
            slots_c.data_ptr(),
            tables.data_ptr(),
            plan.row_table.data_ptr(),
            plan.row_pos.data_ptr(),
        )
        layers = self._layer_array(k_caches, v_caches, groups)
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


def grouped_plan(
    metas: Sequence[AttentionMetadata], block_size: int, num_blocks: int
) -> tuple[cpu_attention.RowsPlan, torch.Tensor]:
    """A step's rows (`cpu_attention.step_plan` of group 0's metadata, checked) and every KV group's
    tables in the plan's order, at one width ([G, plan's tables, W]; checked by `forward`): the
    groups share the rows, so only group 0's are planned."""
    m = metas[0]
    plan = cpu_attention.step_plan(
        m.prefill_block_tables,
        m.prefill_cu_q_lens,
        m.prefill_seq_lens,
        m.decode_block_tables,
        m.decode_seq_lens,
        block_size,
        num_blocks,
    )
    np_ = m.num_prefill_tokens
    parts = [plan.tables]
    parts += [
        cpu_attention.step_tables(g.prefill_block_tables, np_, g.decode_block_tables) for g in metas[1:]
    ]
    width = max(p.shape[1] for p in parts)
    last = int(plan.row_pos.max()) if plan.row_pos.numel() else -1
    if any(p.shape[0] != plan.tables.shape[0] or p.shape[1] * block_size <= last for p in parts):
        raise ValueError("every KV group needs a table covering each of the step's sequences")
    return plan, torch.stack([F.pad(p, (0, width - p.shape[1])) for p in parts])


def native_decoder(
    layers: Sequence[DecoderLayer],
    final_norm: torch.Tensor,
    shape: tuple[int, int, int, int, int],
    eps: float,
    scale: float,
) -> NativeDecoder | None:
    """The decoder over these layers (`shape`: hidden, q heads, kv heads, head dim, intermediate), or
    None where it does not run: `RADIXD_CPU_DECODER=torch`, a dimension not a multiple of 8, a norm
    weight not float32 on the CPU, or no compiled library (then `native` raises RuntimeError)."""
    want = choice()
    if want == "torch":
        return None
    hidden, hq, hkv, d, inter = shape
    tensors = [final_norm, *(t for lw in layers for t in lw.norms())]
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
