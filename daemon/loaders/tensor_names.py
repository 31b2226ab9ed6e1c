"""The one renaming table from a checkpoint's tensor names to our fused layout's (`LlamaWeights.tensors()`).

Each of our tensors names its parts in each format (`gguf`: llama.cpp's names, `hf`: Hugging Face's); a
fused tensor is its parts concatenated along dim 0, in order. `{i}` stands for the layer index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import torch

from radixd.daemon.model.stored import Stored, Weight

Format = Literal["gguf", "hf"]

MODEL_TENSORS: dict[str, dict[Format, str]] = {
    "embed": {"gguf": "token_embd.weight", "hf": "model.embed_tokens.weight"},
    "norm": {"gguf": "output_norm.weight", "hf": "model.norm.weight"},
    "lm_head": {"gguf": "output.weight", "hf": "lm_head.weight"},
}

_HF_ATTN = "model.layers.{i}.self_attn."
_HF_MLP = "model.layers.{i}.mlp."
LAYER_TENSORS: dict[str, dict[Format, tuple[str, ...]]] = {
    "qkv": {
        "gguf": ("blk.{i}.attn_q.weight", "blk.{i}.attn_k.weight", "blk.{i}.attn_v.weight"),
        "hf": tuple(_HF_ATTN + f"{n}_proj.weight" for n in "qkv"),
    },
    "qkv_bias": {
        "gguf": ("blk.{i}.attn_q.bias", "blk.{i}.attn_k.bias", "blk.{i}.attn_v.bias"),
        "hf": tuple(_HF_ATTN + f"{n}_proj.bias" for n in "qkv"),
    },
    "o_proj": {"gguf": ("blk.{i}.attn_output.weight",), "hf": (_HF_ATTN + "o_proj.weight",)},
    "o_bias": {"hf": (_HF_ATTN + "o_proj.bias",)},
    "attn_norm": {"gguf": ("blk.{i}.attn_norm.weight",), "hf": ("model.layers.{i}.input_layernorm.weight",)},
    "mlp_norm": {
        "gguf": ("blk.{i}.ffn_norm.weight",),
        "hf": ("model.layers.{i}.post_attention_layernorm.weight",),
    },
    "gate_up": {
        "gguf": ("blk.{i}.ffn_gate.weight", "blk.{i}.ffn_up.weight"),
        "hf": (_HF_MLP + "gate_proj.weight", _HF_MLP + "up_proj.weight"),
    },
    "down": {"gguf": ("blk.{i}.ffn_down.weight",), "hf": (_HF_MLP + "down_proj.weight",)},
    "q_norm": {"gguf": ("blk.{i}.attn_q_norm.weight",), "hf": (_HF_ATTN + "q_norm.weight",)},
    "k_norm": {"gguf": ("blk.{i}.attn_k_norm.weight",), "hf": (_HF_ATTN + "k_norm.weight",)},
    # HF's name for it is Llama's mlp_norm: see HF_SANDWICH.
    "post_attn_norm": {"gguf": ("blk.{i}.post_attention_norm.weight",)},
    "post_mlp_norm": {
        "gguf": ("blk.{i}.post_ffw_norm.weight",),
        "hf": ("model.layers.{i}.post_feedforward_layernorm.weight",),
    },
}
# Present only when the checkpoint has their first part (attention biases: qwen2 and a few others;
# QK-norm: Qwen3, Gemma 3; post norms: Gemma 3).
OPTIONAL = frozenset({"qkv_bias", "o_bias", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm"})
# Gemma's HF names for the norms around the MLP: its `post_attention_layernorm` follows attention,
# and `pre_feedforward_layernorm` is what Llama calls `post_attention_layernorm` (our mlp_norm).
HF_SANDWICH: dict[str, tuple[str, ...]] = {
    "mlp_norm": ("model.layers.{i}.pre_feedforward_layernorm.weight",),
    "post_attn_norm": ("model.layers.{i}.post_attention_layernorm.weight",),
}

# (our tensor, index of the part, the part) -> the part as our layout wants it
PartFix = Callable[[str, int, Weight], Weight]


def _joined(parts: list[Weight]) -> Weight:
    """Float parts concatenated along dim 0; stored matrices stay parts (each in its own format)."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)  # type: ignore[arg-type]
    stored: list[Stored] = []
    for p in parts:
        if isinstance(p, torch.Tensor):
            raise ValueError("a fused tensor mixes stored and float parts")
        stored.extend(p)
    return tuple(stored)


def layer_tensors(
    raw: Mapping[str, Weight],
    fmt: Format,
    i: int,
    fix: PartFix | None = None,
    names_of: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Weight]:
    """Layer `i`'s tensors under our names (`layers.{i}.qkv`, ...) from `raw` in format `fmt`, each part
    passed through `fix` when given, `names_of` replacing some of the table's names (HF_SANDWICH);
    raises KeyError naming the first required tensor `raw` lacks."""
    out: dict[str, Weight] = {}
    for ours, by_format in LAYER_TENSORS.items():
        parts_of = (names_of or {}).get(ours, by_format.get(fmt, ()))
        names = [n.format(i=i) for n in parts_of]
        if not names or (ours in OPTIONAL and names[0] not in raw):
            continue
        parts = [raw[n] for n in names]
        if fix is not None:
            parts = [fix(ours, k, t) for k, t in enumerate(parts)]
        out[f"layers.{i}.{ours}"] = _joined(parts)
    return out
