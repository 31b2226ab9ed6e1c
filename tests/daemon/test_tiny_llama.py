"""A tiny random Llama written in HF format loads, and its logits match transformers' within 1e-4,
through whole-prompt prefill, chunked prefill and decode steps over the paged pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import convert, load_model

VOCAB = 96

CONFIGS: dict[str, dict[str, Any]] = {
    "tied-gqa-default-rope": {"tie_word_embeddings": True, "num_key_value_heads": 2},
    "untied-bias-llama3-rope": {
        "tie_word_embeddings": False,
        "num_key_value_heads": 1,
        "attention_bias": True,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "mha-linear-rope": {
        "num_key_value_heads": 4,
        "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    },
}


def _write_tiny(path: Path, extra: dict[str, Any]) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(path)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return model


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_tiny_llama_logits_match_transformers(tmp_path: Path, variant: str) -> None:
    hf = _write_tiny(tmp_path, CONFIGS[variant])
    lm = load_model(str(tmp_path))
    assert lm.tokenizer.encode("w5 w7 w9") == [5, 7, 9]
    ids = [int(x) for x in torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1))]
    with torch.inference_mode():
        want = hf(torch.tensor([ids])).logits[0].float()
    bs = 8
    runner = ModelRunner(lm.model, num_blocks=16, block_size=bs)
    blocks = [3, 1, 7, 5, 2, 9]  # deliberately out of order
    # Whole prompt in one prefill.
    got = runner.step_logits([StepSeq(0, ids, 0, blocks, None)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # Chunked prefill (11 + 17 tokens) then one-token decode steps, into different blocks.
    blocks2 = [10, 4, 12, 6, 8]
    got2 = [runner.step_logits([StepSeq(1, ids[:11], 0, blocks2, None)])]
    got2.append(runner.step_logits([StepSeq(1, ids[11:28], 11, blocks2, None)]))
    for p in range(28, 40):
        got2.append(runner.step_logits([StepSeq(1, [ids[p]], p, blocks2, None)]))
    torch.testing.assert_close(torch.cat(got2), want, atol=1e-4, rtol=0)


def test_a_bf16_checkpoint_is_held_in_bf16_not_widened(tmp_path: Path) -> None:
    model = _write_tiny(tmp_path, CONFIGS["tied-gqa-default-rope"])
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    read = convert(str(tmp_path)).tensors  # what the loader hands over: no fp32 copy of a matrix
    assert read["layers.0.gate_up"].dtype == torch.bfloat16 and read["norm"].dtype == torch.float32
    lm = load_model(str(tmp_path), dtype="bfloat16")
    layer = lm.model.weights.layers[0]
    for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down):
        assert isinstance(m, torch.Tensor) and m.dtype == torch.bfloat16
    want = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(layer.qkv, torch.Tensor) and torch.equal(layer.qkv[: want.shape[0]], want)
