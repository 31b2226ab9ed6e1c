"""Rotary position embeddings: default, linear and llama3 frequency scaling, HF's rotate-half layout."""

from __future__ import annotations

import math
from typing import Any

import torch


def inv_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, computed the way HF transformers computes them."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "freq_factors":
        # GGUF llama3-style files store the per-frequency divisors directly (tensor rope_freqs.weight).
        factors = torch.tensor(scaling["factors"], dtype=torch.float32)
        if factors.shape != inv.shape:
            raise ValueError(f"rope freq_factors has {factors.numel()} entries, expected {inv.numel()}")
        return inv / factors
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(
        f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3, freq_factors)"
    )


class Rotary:
    """Applies RoPE at arbitrary positions; cos/sin tables grow on demand and are reused."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None, device: torch.device):
        self.head_dim = head_dim
        self.inv_freq = inv_frequencies(head_dim, theta, scaling).to(device)
        self._cos = torch.empty(0, head_dim // 2, device=device)
        self._sin = torch.empty(0, head_dim // 2, device=device)

    def _grow(self, n: int) -> None:
        size = max(n, 2 * self._cos.shape[0], 256)
        pos = torch.arange(size, device=self.inv_freq.device, dtype=torch.float32)
        freqs = pos.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        self._cos, self._sin = freqs.cos(), freqs.sin()

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, max_position: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos [T, 1, D] (halves duplicated) and signed sin [T, 1, D] = (-sin, sin) for `positions` [T]."""
        if max_position < 0:
            max_position = int(positions.max().item()) if positions.numel() else -1
        need = max_position + 1
        if need > self._cos.shape[0]:
            self._grow(need)
        cos = self._cos.index_select(0, positions)
        sin = self._sin.index_select(0, positions)
        cos = torch.cat((cos, cos), dim=-1).unsqueeze(1).to(dtype)
        sin = torch.cat((-sin, sin), dim=-1).unsqueeze(1).to(dtype)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> x*cos + rotate_half(x)*sin via roll(x, D/2)*(-sin, sin): bitwise HF's rotate_half
    ((-a)*b == a*(-b) exactly in IEEE arithmetic)."""
    out = x * cos
    out += torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin
    return out
