"""A tiny Llama written as a GGUF file (llama.cpp layout: permuted Q/K rows, a different format for
nearly every matrix) loads with our loader: float32 matches transformers on the same dequantized
weights within 1e-4, and w4a8 runs each matrix in its stored format close to that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import load_model
from radixd.daemon.model import quant

Q = gguf.GGMLQuantizationType

H, HEADS, KV, FF, LAYERS = 256, 4, 2, 256, 2
TOKENS = [chr(33 + i) for i in range(60)] + ['!"', "#$", "<s>", "</s>"]
VOCAB = len(TOKENS)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _kquant(qt: Any, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random but finite K-quant blocks (gguf-py has no K-quant quantizer): random codes, small fp16
    scales where the format keeps them (Q6_K: its last two bytes; Q4_K, Q5_K: d and dmin first)."""
    size = {Q.Q6_K: 210, Q.Q4_K: 144, Q.Q5_K: 176}[qt]
    blocks = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    if qt == Q.Q6_K:
        blocks[..., 208:] = scale
    else:
        blocks[..., 0:2] = scale
        blocks[..., 2:4] = scale
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
        put(p + "ffn_gate.weight", hp + "mlp.gate_proj.weight", rnd(FF, H), Q.Q5_1 if i else Q.Q8_0)
        put(p + "ffn_up.weight", hp + "mlp.up_proj.weight", rnd(FF, H), Q.F16 if i else Q.BF16)
        for qt, name, hf_name, rows in (
            (Q.Q6_K, "attn_v", "self_attn.v_proj", KV * d),
            (Q.Q4_K if i else Q.Q5_K, "ffn_down", "mlp.down_proj", H),
        ):
            blocks = _kquant(qt, rows, H, rng)
            w.add_tensor(p + f"{name}.weight", blocks, raw_dtype=qt)
            ref[hp + f"{hf_name}.weight"] = gguf.quants.dequantize(blocks, qt).astype(np.float32)
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
    # A second load is identical.
    again = load_model(str(tmp_path / "tiny.gguf"))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            again.model.weights.tensors().values(), lm.model.weights.tensors().values(), strict=True
        )
    )


def test_w4a8_runs_every_matrix_in_its_stored_format(tmp_path: Path) -> None:
    _write(tmp_path / "tiny.gguf")
    ref = load_model(str(tmp_path / "tiny.gguf"), dtype="float32")
    lm = load_model(str(tmp_path / "tiny.gguf"), dtype="auto")
    assert lm.model.precision.name == "w4a8"
    codings = {getattr(p, "coding", None) for p in lm.model.projections()}
    # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K: the file's blocks, or the same blocks repacked
    # where `auto` takes that on this machine
    stored = {"Q4_1": "q4_1_a8", "Q8_0": "q8_0_a8", **quant.RAW_KINDS}
    formats = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
    chosen = (quant.X16_KINDS[k] if quant.x16_pays(k) else stored[k] for k in formats)
    q40, q41, q50, q51, q80, k4, k5, k6 = chosen
    assert {f"{q40}+{q41}+{k6}", f"{q80}+bf16", f"{q51}+f16", k4, k5, q50, "f16"} <= codings
    ids = [int(x) for x in torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(2))]
    table = [2, 4, 6, 1]
    want = ModelRunner(ref.model, num_blocks=8, block_size=8).step_logits([StepSeq(0, ids, 0, table, None)])
    got = ModelRunner(lm.model, num_blocks=8, block_size=8).step_logits([StepSeq(0, ids, 0, table, None)])
    # 8-bit activations: close to the float product, not equal to it
    err = (got - want).abs().max() / want.abs().max()
    assert 0 < err < 0.06, err
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
