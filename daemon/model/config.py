"""Model hyper-parameters, independent of where the weights came from (GGUF or HF directory).

The families differ only in data here (activation, norms in fp32, embedding scale, query scale,
per-layer sliding windows and a second rope base); `layer.py` reads it, no subclass per family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder's shape. `rope_scaling` follows HF's dict form ({"rope_type": ...}).

    Defaults are plain Llama. `activation`: the MLP gate's ("silu": SwiGLU, "gelu_tanh": GeGLU);
    `fp32_norms`: RMSNorms computed in fp32 with fp32 weights (Gemma: weights hold 1 + w);
    `embed_scale`: embeddings times this, in their dtype; `query_scale`: 0 = head_dim ** -0.5;
    `layer_windows`: each layer's sliding window (0 = full; () = every layer full);
    `local_rope_theta`: rope base of the windowed layers, unscaled (0 = the global rope)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    activation: str = "silu"
    fp32_norms: bool = False
    embed_scale: float = 1.0
    query_scale: float = 0.0
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config {name} must be > 0, got {getattr(self, name)}")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even number, got {self.head_dim}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not supported (supported: {ACTIVATIONS})")
        if self.layer_windows and (len(self.layer_windows) != self.num_layers or min(self.layer_windows) < 0):
            raise ValueError(
                f"layer_windows needs {self.num_layers} windows >= 0, got {list(self.layer_windows)}"
            )

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window: a query at position p sees keys p-W+1..p (0 = all)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def attention_scale(self) -> float:
        return self.query_scale or self.head_dim**-0.5

    @property
    def num_params(self) -> int:
        """Parameters touched per token (embedding lookup excluded, lm_head included)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp + 2 * h) + h + self.vocab_size * h

    def to_dict(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_ids": list(self.eos_token_ids),
            "activation": self.activation,
            "fp32_norms": self.fp32_norms,
            "embed_scale": self.embed_scale,
            "query_scale": self.query_scale,
            "layer_windows": list(self.layer_windows),
            "local_rope_theta": self.local_rope_theta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
        d["layer_windows"] = tuple(d.get("layer_windows") or ())
        return cls(**d)
