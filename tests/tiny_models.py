"""Random-weight models written as Hugging Face folders, for tests in any folder (tests/ is on the path)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_tiny_gemma3(path: Path, layer_types: list[str], window: int, vocab: int = 64) -> Path:
    """A random-weight Gemma 3 (transformers' classes, sliding and full layers as `layer_types` says)
    saved as a Hugging Face folder with a word-level tokenizer ("w0" .. "w{vocab-1}")."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        max_position_embeddings=256,
        sliding_window=window,
        layer_types=layer_types,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((0.1 if name.endswith("norm.weight") else 0.15) * torch.randn_like(p))
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return path
