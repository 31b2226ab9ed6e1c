"""A tiny Llama written as a GGUF file (llama.cpp layout: permuted Q/K rows, mixed quant types) loads
with our loader, and its logits match transformers' on the same dequantized weights within 1e-4."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import load_model

Q = gguf.GGMLQuantizationType

H, HEADS, KV, FF, LAYERS = 256, 4, 2, 256, 2
TOKENS = [chr(33 + i) for i in range(60)] + ['!"', "#$", "<s>", "</s>"]
VOCAB = len(TOKENS)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _q6k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random but finite Q6_K blocks (210 bytes per 256 values; the last two bytes are the fp16 scale)."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 210), dtype=np.uint8)
    blocks[..., 208:] = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def _write(path: Path) -> dict[str, np.ndarray]:
    """Write the GGUF; return the dequantized weights under HF names (the reference)."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_types([1] * 62 + [3, 3])
    w.add_token_merges(['! "', "# $"])
    w.add_bos_token_id(62)
    w.add_eos_token_id(63)
    ref: dict[str, np.ndarray] = {}

    def put(name: str, hf: str, x: np.ndarray, qt: Any, n_head: int = 0) -> None:
        stored = _permute(x, n_head) if n_head else x
        if qt == Q.F32:
            data = stored.astype(np.float32)
        elif qt == Q.F16:
            data = stored.astype(np.float16)
        else:
            data = gguf.quants.quantize(stored.astype(np.float32), qt)
        w.add_tensor(name, data, raw_dtype=qt)
        back = gguf.quants.dequantize(data, qt).astype(np.float32).reshape(x.shape)
        # The reference sees what the file holds, un-permuted back to HF's layout.
        ref[hf] = _permute_inverse(back, n_head) if n_head else back

    def rnd(*shape: int, s: float = 0.1) -> np.ndarray:
        return (s * rng.standard_normal(shape)).astype(np.float32)

    put("token_embd.weight", "model.embed_tokens.weight", rnd(VOCAB, H, s=1.0), Q.Q8_0)
    put("output_norm.weight", "model.norm.weight", 1 + rnd(H), Q.F32)
    put("output.weight", "lm_head.weight", rnd(VOCAB, H), Q.F16)
    d = H // HEADS
    for i in range(LAYERS):
        p, hp = f"blk.{i}.", f"model.layers.{i}."
        put(p + "attn_norm.weight", hp + "input_layernorm.weight", 1 + rnd(H), Q.F32)
        put(p + "attn_q.weight", hp + "self_attn.q_proj.weight", rnd(H, H), Q.Q4_0, HEADS)
        put(p + "attn_k.weight", hp + "self_attn.k_proj.weight", rnd(KV * d, H), Q.Q4_1, KV)
        put(p + "attn_output.weight", hp + "self_attn.o_proj.weight", rnd(H, H), Q.Q5_0)
        put(p + "ffn_norm.weight", hp + "post_attention_layernorm.weight", 1 + rnd(H), Q.F32)
        put(p + "ffn_gate.weight", hp + "mlp.gate_proj.weight", rnd(FF, H), Q.Q8_0)
        put(p + "ffn_up.weight", hp + "mlp.up_proj.weight", rnd(FF, H), Q.F16)
        put(p + "ffn_down.weight", hp + "mlp.down_proj.weight", rnd(H, FF), Q.Q4_1)
        v = _q6k(KV * d, H, rng)
        w.add_tensor(p + "attn_v.weight", v, raw_dtype=Q.Q6_K)
        ref[hp + "self_attn.v_proj.weight"] = gguf.quants.dequantize(v, Q.Q6_K).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def _permute_inverse(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_tiny_gguf_matches_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("RADIXD_CACHE_DIR", str(tmp_path / "cache"))
    ref = _write(tmp_path / "tiny.gguf")
    lm = load_model(str(tmp_path / "tiny.gguf"))
    assert lm.config.num_kv_heads == KV and not lm.config.tie_word_embeddings
    assert lm.tokenizer.encode('!"#$%') == [60, 61, 4]
    assert lm.tokenizer.encode("<s>!") == [62, 0]
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        rms_norm_eps=1e-5,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    hf = LlamaForCausalLM(cfg).eval()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in ref.items()}, strict=True)
    ids = [int(x) for x in torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(2))]
    with torch.inference_mode():
        want = hf(torch.tensor([ids])).logits[0].float()
    runner = ModelRunner(lm.model, num_blocks=8, block_size=8)
    got = runner.step_logits([StepSeq(0, ids, 0, [2, 4, 6, 1], None)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # The second load comes from the cache and is identical.
    again = load_model(str(tmp_path / "tiny.gguf"))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            again.model.weights.tensors().values(), lm.model.weights.tensors().values(), strict=True
        )
    )
