"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU, tied embeddings, optional q/k/v (and o) bias),
with the Qwen3 and Gemma 3 layer features as data (`layer.py`).

Attention uses the paged KV pool only through `radixd.kernels`; weights are fused (qkv, gate-up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixd import kernels
from radixd.daemon.model.config import ModelConfig
from radixd.daemon.model.f32 import F32Linear, Widened16Linear, f32_available
from radixd.daemon.model.int4 import Int4Linear
from radixd.daemon.model.layer import (
    EXTRA_NORMS,
    AttentionMetadata,
    LayerOps,
    LayerWeights,
    Norm,
    paged_attention,
    rms_norm,
    run_layer,
)
from radixd.daemon.model.linear import GROUP, InOutLinear, Int8Linear, Linear, OutInLinear, PackedLinear
from radixd.daemon.model.native_decoder import DecoderLayer, NativeDecoder, grouped_plan, native_decoder
from radixd.daemon.model.precision import Precision, cpu_has_native_bf16, precision_of_dtype
from radixd.daemon.model.q8 import Q8Linear, q8_available
from radixd.daemon.model.quant import RUNNABLE, QuantLinear, StoredEmbedding
from radixd.daemon.model.rope import Rotary
from radixd.daemon.model.stored import Weight

__all__ = ["AttentionMetadata", "LayerWeights", "LlamaModel", "LlamaWeights", "make_linear", "rms_norm"]


# The layer tensors a checkpoint may lack (None in `LayerWeights`).
OPTIONAL_TENSORS = ("qkv_bias", "o_bias", *EXTRA_NORMS)


@dataclass
class LlamaWeights:
    embed: Weight  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: Weight  # [V, H]; the same object as embed when tied

    def tensors(self) -> dict[str, Weight]:
        """Flat name -> tensor map (the cache format); lm_head is omitted when tied."""
        out: dict[str, Weight] = {"embed": self.embed, "norm": self.norm}
        if self.lm_head is not self.embed:
            out["lm_head"] = self.lm_head
        for i, lw in enumerate(self.layers):
            for name in ("attn_norm", "qkv", "o_proj", "mlp_norm", "gate_up", "down"):
                out[f"layers.{i}.{name}"] = getattr(lw, name)
            for name in OPTIONAL_TENSORS:
                if getattr(lw, name) is not None:
                    out[f"layers.{i}.{name}"] = getattr(lw, name)
        return out

    @classmethod
    def from_tensors(cls, t: dict[str, Weight], num_layers: int) -> LlamaWeights:
        def vec(name: str) -> torch.Tensor:
            v = t[name]
            assert isinstance(v, torch.Tensor), name
            return v

        def opt(name: str) -> torch.Tensor | None:
            return vec(name) if name in t else None

        layers = [
            LayerWeights(
                attn_norm=vec(f"layers.{i}.attn_norm"),
                qkv=t[f"layers.{i}.qkv"],
                qkv_bias=opt(f"layers.{i}.qkv_bias"),
                o_proj=t[f"layers.{i}.o_proj"],
                o_bias=opt(f"layers.{i}.o_bias"),
                mlp_norm=vec(f"layers.{i}.mlp_norm"),
                gate_up=t[f"layers.{i}.gate_up"],
                down=t[f"layers.{i}.down"],
                **{n: opt(f"layers.{i}.{n}") for n in EXTRA_NORMS},
            )
            for i in range(num_layers)
        ]
        embed = t["embed"]
        return cls(embed=embed, layers=layers, norm=vec("norm"), lm_head=t.get("lm_head", embed))


def runs_stored(prec: Precision, device: torch.device) -> bool:
    """Whether `prec` runs a file's stored matrices as they are (w4a8 on the host's native kernels)."""
    return prec.activations == "int8" and kernels.host_kernels(device) and f32_available()


def as_float(w: Weight) -> torch.Tensor:
    """`w` as fp32 (or its float dtype) rows: stored parts dequantized and joined."""
    if isinstance(w, torch.Tensor):
        return w
    return torch.cat([p.dequantize() for p in w]) if len(w) > 1 else w[0].dequantize()


def make_linear(w: Weight, bias: torch.Tensor | None, prec: Precision, device: torch.device) -> Linear:
    """The projection of [out, in] matrix `w` (and `bias`) that `prec` runs, on `device`."""
    if isinstance(w, tuple):
        if runs_stored(prec, device) and all(p.kind in RUNNABLE for p in w):
            return QuantLinear(w, None if bias is None else bias.float())
        w = as_float(w)
    b = None if bias is None else bias.to(device=device, dtype=prec.dtype)
    host = kernels.host_kernels(device)  # else the GPU's projections (torch matmuls), on any device
    # 16-bit GEMMs are emulated and not row-invariant on CPUs without native bf16 (`Widened16Linear`).
    widen = host and not cpu_has_native_bf16() and f32_available()
    dense16 = Widened16Linear if widen else OutInLinear
    if prec.weights == "int8":
        return Int8Linear(w.to(device), b, prec.dtype, dense16)
    if prec.weights == "int4":
        return Int4Linear(w.to(device), b, prec.dtype)
    wc = w.to(device=device, dtype=prec.dtype).contiguous()
    if prec.dtype != torch.float32:
        return dense16(wc, b)
    if host and f32_available():
        return F32Linear(wc, b, int8_activations=prec.activations == "int8")
    if host and torch._C._has_mkldnn:
        return PackedLinear(wc, b)
    return InOutLinear(wc, b)


def make_lm_head(w: Weight, prec: Precision, device: torch.device) -> Linear:
    """The lm_head of [V, H] matrix `w` that `prec` runs, on `device`: quantized modes hold it as int8
    per 32 inputs (`q8.py`), never 4 bits (GGUFs keep the head at 8+ bits); w4a8 as the file stores it."""
    if isinstance(w, tuple) and runs_stored(prec, device):
        return make_linear(w, None, prec, device)
    w = as_float(w)
    quantized = prec.weights != "float" and w.shape[1] % GROUP == 0
    if quantized and kernels.host_kernels(device) and q8_available():
        return Q8Linear(w.to(device), None, prec.dtype)
    return make_linear(w, None, precision_of_dtype(prec.dtype) if prec.weights == "int4" else prec, device)


class LlamaModel:
    """The decoder. `forward` returns final-norm hidden states; `logits` projects chosen rows.
    Weights are converted to `precision` here; `weights` then holds the tensors the projections run."""

    def __init__(
        self,
        config: ModelConfig,
        weights: LlamaWeights,
        device: str = "cpu",
        precision: Precision | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        embed_dtype = weights.embed.dtype if isinstance(weights.embed, torch.Tensor) else torch.float32
        prec = precision or precision_of_dtype(embed_dtype)
        self.precision = prec
        self.dtype = prec.dtype
        self.kv_dtype = prec.kv_dtype
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling, self.device)
        # Windowed layers with their own rope base (Gemma 3's local layers) use a second table.
        self.rotaries = [self.rotary]
        if config.local_rope_theta and any(config.layer_windows):
            self.rotaries.append(Rotary(config.head_dim, config.local_rope_theta, None, self.device))
        self._layer_rope = [
            int(len(self.rotaries) > 1 and config.window(i) > 0) for i in range(config.num_layers)
        ]
        self.scale = config.attention_scale
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self._norm = Norm(config)

        def cv(x: torch.Tensor) -> torch.Tensor:
            return x.to(device=self.device, dtype=prec.dtype).contiguous()

        def cn(x: torch.Tensor) -> torch.Tensor:
            return self._norm.weight(x, self.device, prec.dtype)

        self._ops: list[LayerOps] = []
        for lw in weights.layers:
            ops = LayerOps(
                make_linear(lw.qkv, lw.qkv_bias, prec, self.device),
                make_linear(lw.o_proj, lw.o_bias, prec, self.device),
                make_linear(lw.gate_up, None, prec, self.device),
                make_linear(lw.down, None, prec, self.device),
            )
            lw.qkv, lw.o_proj = ops.qkv.weight, ops.o_proj.weight
            lw.gate_up, lw.down = ops.gate_up.weight, ops.down.weight
            lw.qkv_bias, lw.o_bias = ops.qkv.bias, ops.o_proj.bias
            lw.attn_norm, lw.mlp_norm = cn(lw.attn_norm), cn(lw.mlp_norm)
            for name in EXTRA_NORMS:
                if getattr(lw, name) is not None:
                    setattr(lw, name, cn(getattr(lw, name)))
            self._ops.append(ops)
        tied = weights.lm_head is weights.embed
        self._stored_embed: StoredEmbedding | None = None
        if isinstance(weights.embed, tuple) and runs_stored(prec, self.device):
            self._lm_head = make_lm_head(weights.lm_head, prec, self.device)
            head = self._lm_head
            if tied and isinstance(head, QuantLinear):
                table = head
            else:  # a table only read by rows: kept as mapped
                table = QuantLinear(weights.embed, None, repack=False)
            self._stored_embed = StoredEmbedding(table.gemm)
            weights.lm_head = head.weight
            weights.embed = head.weight if tied else weights.embed
        elif prec.weights == "float":
            weights.embed = cv(as_float(weights.embed))
            self._lm_head = make_lm_head(weights.embed if tied else weights.lm_head, prec, self.device)
            weights.lm_head = weights.embed if tied else self._lm_head.weight
        else:
            self._lm_head = make_lm_head(weights.lm_head, prec, self.device)
            weights.embed = self._lm_head.weight if tied else cv(as_float(weights.embed))
            weights.lm_head = self._lm_head.weight
        weights.norm = cn(weights.norm)
        self.weights = weights
        self._native = self._native_decoder()

    def _native_decoder(self) -> NativeDecoder | None:
        """The float32 / w4a8 layers as one compiled call, where every projection is an `F32Linear`
        (never off the host path: `make_linear` makes none there)."""
        cfg = self.config
        if self.dtype != torch.float32 or cfg.activation not in ("silu", "gelu_tanh"):
            return None
        layers = []
        for li, (lw, m) in enumerate(zip(self.weights.layers, self._ops, strict=True)):
            ops = [o for o in (m.qkv, m.o_proj, m.gate_up, m.down) if isinstance(o, (F32Linear, QuantLinear))]
            if len(ops) < 4:
                return None
            qkv, o_proj, gate_up, down = ops
            extra = {n: getattr(lw, n) for n in EXTRA_NORMS}
            gelu, rope, window = cfg.activation == "gelu_tanh", self._layer_rope[li], cfg.window(li)
            layers.append(
                DecoderLayer(
                    lw.attn_norm,
                    lw.mlp_norm,
                    qkv,
                    o_proj,
                    gate_up,
                    down,
                    **extra,
                    gelu=gelu,
                    rope=rope,
                    window=window,
                )
            )
        shape = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size)
        return native_decoder(layers, self.weights.norm, shape, cfg.rms_norm_eps, self.scale)

    def projections(self) -> list[Linear]:
        """Every weight matrix's projection, layers in order, then the lm_head."""
        return [o for ops in self._ops for o in (ops.qkv, ops.o_proj, ops.gate_up, ops.down)] + [
            self._lm_head
        ]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """input_ids, positions: int64 [T]; `k_caches` / `v_caches`: each layer's pool (layers may share
        one where their groups differ: kv_layout.py). Writes each layer's new K/V. -> [T, H]."""
        cfg = self.config
        if meta.layer_group and (
            len(meta.layer_group) != cfg.num_layers or max(meta.layer_group) > len(meta.sliding)
        ):
            raise ValueError(
                f"layer_group {meta.layer_group} needs one group per layer in [0, {len(meta.sliding)}]"
            )
        w = self.weights
        t = input_ids.shape[0]
        np_ = meta.num_prefill_tokens
        ropes = [r.cos_sin(positions, self.dtype, meta.max_position) for r in self.rotaries]
        h = self.embed(input_ids)
        if cfg.embed_scale != 1.0:
            # As HF scales: by the factor rounded to the embeddings' dtype, in that dtype.
            h *= torch.tensor(cfg.embed_scale, dtype=h.dtype)
        # The layers of a group attend through the same tables.
        metas = [meta.group(g) for g in range(1 + len(meta.sliding))]
        groups = meta.layer_group or (0,) * cfg.num_layers
        if self._native is not None and self._native.takes(k_caches[0]):
            rows, tables = grouped_plan(metas, k_caches[0].shape[1], k_caches[0].shape[0])
            slots = [gm.slot_mapping for gm in metas]
            return self._native.forward(h, ropes, slots, rows, tables, groups, k_caches, v_caches)
        # A group's decode work split is planned once.
        attends = []
        for gm in metas:
            plan = None
            if np_ < t:
                plan = kernels.decode_step_plan(gm.decode_block_tables, gm.decode_seq_lens, k_caches[0])
            attends.append(paged_attention(gm, t, self.scale, plan))

        for li, (lw, m) in enumerate(zip(w.layers, self._ops, strict=True)):
            rope = ropes[self._layer_rope[li]]
            caches = (k_caches[li], v_caches[li])
            g = groups[li]
            run_layer(
                h, lw, m, cfg, self._norm, rope, caches, metas[g].slot_mapping, attends[g], cfg.window(li)
            )
        return self._norm(h, w.norm)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int64 ids [T] -> their embeddings [T, H] in the activation dtype."""
        if self._stored_embed is not None:
            return self._stored_embed(input_ids)
        table = self.weights.embed
        assert isinstance(table, torch.Tensor)
        return F.embedding(input_ids, table)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> fp32 logits [N, V]."""
        return self._lm_head(hidden).float()
