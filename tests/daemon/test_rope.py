"""RoPE frequencies: llama3 scaling equals the per-frequency divisors GGUF files store."""

from __future__ import annotations

import pytest
import torch

from radixd.daemon.model.rope import Rotary, apply_rotary, inv_frequencies

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_freq_factors_reproduce_llama3_scaling() -> None:
    base = inv_frequencies(128, 500000.0, None)
    llama3 = inv_frequencies(128, 500000.0, LLAMA3)
    factors = (base / llama3).tolist()
    got = inv_frequencies(128, 500000.0, {"rope_type": "freq_factors", "factors": factors})
    torch.testing.assert_close(got, llama3)
    assert not torch.equal(llama3, base)


def test_linear_scaling_divides_and_unknown_kind_raises() -> None:
    base = inv_frequencies(64, 10000.0, None)
    torch.testing.assert_close(inv_frequencies(64, 10000.0, {"rope_type": "linear", "factor": 4.0}), base / 4)
    with pytest.raises(ValueError, match="yarn"):
        inv_frequencies(64, 10000.0, {"rope_type": "yarn", "factor": 4.0})


def test_rotation_matches_rotate_half_formula() -> None:
    rot = Rotary(16, 10000.0, None, torch.device("cpu"))
    pos = torch.tensor([0, 3, 17, 300])
    x = torch.randn(4, 2, 16)
    cos, sin = rot.cos_sin(pos, torch.float32)
    freqs = pos.float()[:, None] * inv_frequencies(16, 10000.0, None)[None, :]
    c = torch.cat((freqs.cos(), freqs.cos()), -1)[:, None]
    s = torch.cat((freqs.sin(), freqs.sin()), -1)[:, None]
    half = torch.cat((-x[..., 8:], x[..., :8]), -1)
    assert torch.equal(apply_rotary(x, cos, sin), x * c + half * s)
