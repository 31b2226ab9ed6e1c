"""One decoder layer's computation; the families' differences are data (`ModelConfig`'s fields and
the optional tensors of `LayerWeights`), never a subclass.

Llama / Mistral / Qwen2: norm -> attention -> residual, norm -> SwiGLU -> residual. Qwen3 adds a
per-head RMSNorm on q and k before RoPE; Gemma 3 adds that, a norm after attention and after the
MLP (before each residual add), GeGLU, and norms computed in fp32 over weights holding 1 + w.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from radixd import kernels
from radixd.daemon.model.config import ModelConfig
from radixd.daemon.model.linear import Linear
from radixd.daemon.model.rope import apply_rotary
from radixd.daemon.model.stored import Weight
from radixd.kernels import cpu_attention
from radixd.kernels.decode_plan import DecodePlan

# The norms only some families' layers have (`LayerWeights`' optional tensors besides biases).
EXTRA_NORMS = ("q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")


@dataclass
class LayerWeights:
    """One decoder layer. qkv: [(Hq + 2 Hkv) * D, H]; gate_up: [2 I, H] (gate rows first); matrices
    as float rows or as a file's stored parts (`stored.Weight`). Optional: q_norm / k_norm [D]
    (QK-norm: Qwen3, Gemma 3), post_attn_norm / post_mlp_norm [H] (applied to the attention's and the
    MLP's output before the residual add: Gemma 3)."""

    attn_norm: torch.Tensor
    qkv: Weight
    qkv_bias: torch.Tensor | None
    o_proj: Weight
    o_bias: torch.Tensor | None
    mlp_norm: torch.Tensor
    gate_up: Weight
    down: Weight
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None


# (q [T, Hq, D], k pool, v pool, window) -> attention output [T, Hq, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class GroupTables:
    """A sliding group's share of a step: `AttentionMetadata`'s fields of the same names, over that
    group's tables (entries left of the window may be 0: the kernels' window skips those keys)."""

    slot_mapping: torch.Tensor  # int64 [T]
    prefill_block_tables: torch.Tensor  # int32 [Sp, max_blocks]
    decode_block_tables: torch.Tensor  # int32 [Sd, max_blocks]


@dataclass
class AttentionMetadata:
    """Batch layout for one forward: the first `num_prefill_tokens` tokens belong to prefill sequences
    (attended with paged_prefill), the rest are one decode token per sequence (paged_decode).
    The tables and slots here are group 0's (the block tables); layer l reads and writes those of
    group `layer_group[l]` (() = every layer group 0), g >= 1 being `sliding[g - 1]` (kv_layout.py)."""

    slot_mapping: torch.Tensor  # int64 [T]
    num_prefill_tokens: int
    prefill_block_tables: torch.Tensor  # int32 [Sp, max_blocks]
    prefill_cu_q_lens: torch.Tensor  # int32 [Sp + 1]
    prefill_seq_lens: torch.Tensor  # int32 [Sp]
    decode_block_tables: torch.Tensor  # int32 [Sd, max_blocks]
    decode_seq_lens: torch.Tensor  # int32 [Sd]
    max_position: int = -1  # largest position in the step if known on the host (saves a device sync)
    sliding: tuple[GroupTables, ...] = ()
    layer_group: tuple[int, ...] = ()

    def group(self, g: int) -> AttentionMetadata:
        """The metadata as the layers of group `g` see it (group 0: this one)."""
        if g == 0:
            return self
        t = self.sliding[g - 1]
        return replace(
            self,
            slot_mapping=t.slot_mapping,
            prefill_block_tables=t.prefill_block_tables,
            decode_block_tables=t.decode_block_tables,
            sliding=(),
            layer_group=(),
        )


def paged_attention(
    meta: AttentionMetadata, t: int, scale: float, plan: DecodePlan | cpu_attention.RowsPlan | None
) -> Attend:
    """The step's attention over the paged pool: its first `meta.num_prefill_tokens` of `t` rows through
    paged_prefill, the rest (one decode token a sequence) through paged_decode with `plan`."""
    np_ = meta.num_prefill_tokens

    def prefill(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, window: int) -> torch.Tensor:
        return kernels.paged_prefill(
            q,
            kc,
            vc,
            meta.prefill_block_tables,
            meta.prefill_cu_q_lens,
            meta.prefill_seq_lens,
            scale,
            window=window,
        )

    def decode(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, window: int) -> torch.Tensor:
        return kernels.paged_decode(
            q,
            kc,
            vc,
            meta.decode_block_tables,
            meta.decode_seq_lens,
            scale,
            plan=plan,
            window=window,
        )

    def attend(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, window: int) -> torch.Tensor:
        if np_ == t:
            return prefill(q, kc, vc, window)
        if np_ == 0:
            return decode(q, kc, vc, window)
        return torch.cat((prefill(q[:np_], kc, vc, window), decode(q[np_:], kc, vc, window)), dim=0)

    return attend


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm as one fused op (bitwise equal to HF's fp32 formula on CPU)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class Norm:
    """The model's RMSNorm over the last dim: in the activations' dtype (Llama, Qwen), or in fp32 with
    fp32 weights and the result cast back (Gemma, whose weights hold 1 + w)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.eps = cfg.rms_norm_eps
        self.fp32 = cfg.fp32_norms

    def weight(self, w: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """A norm weight as this norm computes with it."""
        return w.to(device=device, dtype=torch.float32 if self.fp32 else dtype).contiguous()

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.fp32 and x.dtype != torch.float32:
            return rms_norm(x.float(), w, self.eps).to(x.dtype)
        return rms_norm(x, w, self.eps)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x, inplace=True)


GATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": _silu, "gelu_tanh": _gelu_tanh}


@dataclass
class LayerOps:
    """One layer's projections in the precision's layout and kernels."""

    qkv: Linear
    o_proj: Linear
    gate_up: Linear
    down: Linear


def run_layer(
    h: torch.Tensor,
    lw: LayerWeights,
    ops: LayerOps,
    cfg: ModelConfig,
    norm: Norm,
    rope: tuple[torch.Tensor, torch.Tensor],
    caches: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
    attend: Attend,
    window: int,
) -> None:
    """Layer `lw` on the residual stream `h` [T, H] (updated in place); stores the tokens' K/V at
    `slots` in `caches` and attends with `attend` over `window` keys (0 = all)."""
    t = h.shape[0]
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qk_size = (hq + hkv) * d
    cos, sin = rope
    qkv = ops.qkv(norm(h, lw.attn_norm))
    v = qkv[:, qk_size:].view(t, hkv, d)
    if lw.q_norm is None or lw.k_norm is None:
        # Rotate q and k together: one set of elementwise ops per layer instead of two.
        qk = apply_rotary(qkv[:, :qk_size].view(t, hq + hkv, d), cos, sin)
        q, k = qk[:, :hq], qk[:, hq:]
    else:
        q = apply_rotary(norm(qkv[:, : hq * d].view(t, hq, d), lw.q_norm), cos, sin)
        k = apply_rotary(norm(qkv[:, hq * d : qk_size].view(t, hkv, d), lw.k_norm), cos, sin)
    kc, vc = caches
    kernels.store_kv(k, v, kc, vc, slots)
    out = ops.o_proj(attend(q, kc, vc, window).reshape(t, hq * d))
    if lw.post_attn_norm is not None:
        out = norm(out, lw.post_attn_norm)
    h += out
    gu = ops.gate_up(norm(h, lw.mlp_norm))
    inter = gu.shape[1] // 2
    gate = GATES[cfg.activation](gu[:, :inter])
    out = ops.down(gate.mul_(gu[:, inter:]))
    if lw.post_mlp_norm is not None:
        out = norm(out, lw.post_mlp_norm)
    h += out
