"""Each family radixd runs, as random-weight tiny models: transformers' model saved as a Hugging Face
directory, and the same weights written as a GGUF file the way llama.cpp's converter writes them
(F32 tensors; Q/K rows permuted for `llama`; Gemma's norms stored as 1 + w). radixd in float32 gives
transformers' greedy tokens and logits within 1e-4, from either, alone and in chunked prefill."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from daemon_testkit import BlockAlloc, Req, hf_generate, run
from tokenizers import Tokenizer, models, pre_tokenizers

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import ModelLoadError, load_model
from radixd.daemon.model.f32 import f32_available

VOCAB = 96
PROMPT_LEN, N_NEW = 30, 8
WINDOW = 8  # smaller than every test sequence
LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
LLAMA3_OLD_CTX = 16

BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# family -> (transformers' config and model classes, config fields beyond BASE, GGUF architecture)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str | None]] = {
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "original_max_position_embeddings": LLAMA3_OLD_CTX,
                **LLAMA3_ROPE,
            },
        },
        "llama",
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"head_dim": 32, "tie_word_embeddings": True, "rope_parameters": {"rope_theta": 1e6}},
        "qwen3",
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "num_hidden_layers": 3,
            "head_dim": 32,
            "query_pre_attn_scalar": 32,  # what llama.cpp assumes for all but the 27B
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "pad_token_id": 0,
        },
        "gemma3",
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        {"sliding_window": WINDOW, "tie_word_embeddings": False},
        None,  # llama.cpp's GGUFs of Mistral are `llama` ones, without the window
    ),
}


Q8 = gguf.GGMLQuantizationType.Q8_0


def _hf_model(family: str) -> Any:
    import transformers

    cfg_name, model_name, extra, _ = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**{**BASE, **extra})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(cfg).eval()
    gemma = family == "gemma3"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma's norms scale by 1 + w: random w around 0; the others' around 1.
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def _save_hf(model: Any, path: Path) -> None:
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation for `llama` (HF rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_factors(head_dim: int, theta: float) -> np.ndarray:
    """The rope_freqs tensor llama.cpp's converter writes for llama3 rope scaling."""
    factor, low, high = LLAMA3_ROPE["factor"], LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"]
    out = []
    for k in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (k / head_dim)
        if wavelen < LLAMA3_OLD_CTX / high:
            out.append(1.0)
        elif wavelen > LLAMA3_OLD_CTX / low:
            out.append(factor)
        else:
            smooth = (LLAMA3_OLD_CTX / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _gguf_name(hf: str, gemma: bool) -> str:
    renames = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in renames:
        return renames[hf]
    _, _, i, *rest = hf.split(".")
    part = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }[".".join(rest[:-1])]
    return f"blk.{i}.{part}.weight"


def _write_gguf(model: Any, family: str, path: Path, pattern: int | list[bool] = 3, q8: bool = False) -> None:
    """`pattern`: gemma3's sliding_window_pattern, as a period or one flag a layer; `q8`: matrices in
    Q8_0 blocks (as a quantized file holds them), else F32."""
    arch = FAMILIES[family][3]
    assert arch is not None
    cfg = model.config
    gemma = arch == "gemma3"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters["full_attention"] if gemma else cfg.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if gemma:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_sliding_window(WINDOW)
        w.add_sliding_window_pattern(pattern)  # 3: layers 0, 1 windowed, 2 global, as layer_types
    if arch == "llama":
        w.add_tensor("rope_freqs.weight", _llama3_factors(cfg.head_dim, rope["rope_theta"]))
    _add_tokenizer(w)
    for hf, t in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        x = t.float().numpy()
        if gemma and hf.endswith("norm.weight"):
            x = x + 1.0
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            x = _permute(x, cfg.num_attention_heads if "q_proj" in hf else cfg.num_key_value_heads)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if q8 and x.ndim == 2:
            w.add_tensor(_gguf_name(hf, gemma), gguf.quants.quantize(x, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(_gguf_name(hf, gemma), x)
    _finish(w)


def _add_tokenizer(w: gguf.GGUFWriter) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(33 + i) for i in range(VOCAB - 2)] + ['!"', "#$"])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges(['! "', "# $"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _check(lm: Any, hf: Any) -> None:
    """radixd's logits over a prompt, and its greedy tokens (whole and chunked prefill), equal HF's."""
    g = torch.Generator().manual_seed(1)
    prompts = [[int(x) for x in torch.randint(3, VOCAB, (n,), generator=g)] for n in (PROMPT_LEN, 13)]
    with torch.inference_mode():
        want = hf(torch.tensor([prompts[0]])).logits[0].float()
    runner = ModelRunner(lm.model, num_blocks=32, block_size=4)
    got = runner.step_logits([StepSeq(0, prompts[0], 0, list(range(1, 9)), None)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    hf.generation_config.eos_token_id = None
    greedy = [hf_generate(hf, p, N_NEW) for p in prompts]
    runner = ModelRunner(lm.model, num_blocks=64, block_size=4)
    reqs = [Req(prompts[0], N_NEW), Req(prompts[1], N_NEW, admit_step=2, chunk=5)]
    assert run(runner, BlockAlloc(64), reqs) == greedy


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_directory_matches_transformers(tmp_path: Path, family: str) -> None:
    hf = _hf_model(family)
    _save_hf(hf, tmp_path)
    lm = load_model(str(tmp_path), dtype="float32")
    assert lm.tokenizer.encode("w5 w7 w9") == [5, 7, 9]
    _check(lm, hf)


@pytest.mark.parametrize("family", [f for f, spec in FAMILIES.items() if spec[3]])
def test_gguf_of_the_same_weights_matches_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    monkeypatch.setenv("RADIXD_CACHE_DIR", str(tmp_path / "cache"))
    hf = _hf_model(family)
    _write_gguf(hf, family, tmp_path / "tiny.gguf")
    lm = load_model(str(tmp_path / "tiny.gguf"), dtype="float32")
    assert lm.config.tie_word_embeddings == hf.config.tie_word_embeddings
    _check(lm, hf)


@pytest.mark.parametrize("family", [f for f, spec in FAMILIES.items() if spec[3]])
def test_the_default_mode_runs_a_quantized_file_of_each_family(tmp_path: Path, family: str) -> None:
    """What users run: `auto` on a quantized GGUF is w4a8 (the blocks as stored, 8-bit activations),
    close to the same file's float32 reference through every family's layer features."""
    _write_gguf(_hf_model(family), family, tmp_path / "q8.gguf", q8=True)
    ref = load_model(str(tmp_path / "q8.gguf"), dtype="float32")
    lm = load_model(str(tmp_path / "q8.gguf"), dtype="auto")
    assert lm.model.precision.name == "w4a8"
    g = torch.Generator().manual_seed(3)
    ids = [int(x) for x in torch.randint(3, VOCAB, (PROMPT_LEN,), generator=g)]
    table = list(range(1, 9))
    want = ModelRunner(ref.model, num_blocks=32, block_size=4).step_logits([StepSeq(0, ids, 0, table, None)])
    got = ModelRunner(lm.model, num_blocks=32, block_size=4).step_logits([StepSeq(0, ids, 0, table, None)])
    assert 0 < float((got - want).abs().max() / want.abs().max()) < 0.05
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


def test_gemma3_config_fields(tmp_path: Path) -> None:
    """The Gemma 3 data the layers run on: windows by layer type, two rope bases, scales, 1 + w norms."""
    hf = _hf_model("gemma3")
    _save_hf(hf, tmp_path)
    lm = load_model(str(tmp_path), dtype="float32")
    cfg = lm.config
    assert cfg.layer_windows == (WINDOW, WINDOW, 0)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (100000.0, 10000.0)
    assert cfg.embed_scale == 8.0 and cfg.query_scale == 32**-0.5 and cfg.activation == "gelu_tanh"
    lw = lm.model.weights.layers[0]
    want = 1.0 + hf.model.layers[0].pre_feedforward_layernorm.weight.float()
    assert torch.equal(lw.mlp_norm, want)
    assert lw.q_norm is not None and lw.post_attn_norm is not None and lw.post_mlp_norm is not None
    assert (lm.model._native is not None) == f32_available()  # the compiled decoder runs its layers
    _write_gguf(hf, "gemma3", tmp_path / "flags.gguf", pattern=[False, True, False])
    flags = load_model(str(tmp_path / "flags.gguf"), dtype="float32").config
    assert flags.layer_windows == (0, WINDOW, 0)
    assert flags.embed_scale == cfg.embed_scale and flags.query_scale == cfg.query_scale


def test_unknown_family_is_named(tmp_path: Path) -> None:
    hf = _hf_model("llama3")
    _save_hf(hf, tmp_path)
    cfg = (tmp_path / "config.json").read_text().replace('"model_type": "llama"', '"model_type": "phi3"')
    (tmp_path / "config.json").write_text(cfg)
    want = "model_type 'phi3' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3_text, gemma3)"
    with pytest.raises(ModelLoadError, match=re.escape(want)):
        load_model(str(tmp_path))
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    _add_tokenizer(w)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, 64), dtype=np.float32))
    _finish(w)
    want = "architecture 'phi3' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3)"
    with pytest.raises(ModelLoadError, match=re.escape(want)):
        load_model(str(tmp_path / "phi.gguf"))


def test_gemma3_softcapping_is_refused(tmp_path: Path) -> None:
    hf = _hf_model("gemma3")
    hf.config.final_logit_softcapping = 30.0
    _save_hf(hf, tmp_path)
    with pytest.raises(ModelLoadError, match="final_logit_softcapping"):
        load_model(str(tmp_path))


def test_gemma3_wrapper_directory_loads_its_text_model(tmp_path: Path) -> None:
    """A `gemma3` (multimodal) directory: config.json nests `text_config`, tensors sit under
    `model.language_model.`; radixd loads the text model from it, as from `gemma3_text`."""
    import safetensors.torch

    hf = _hf_model("gemma3")
    _save_hf(hf, tmp_path / "text")
    _save_hf(hf, tmp_path / "wrapped")
    cj = json.loads((tmp_path / "text" / "config.json").read_text())
    (tmp_path / "wrapped" / "config.json").write_text(
        json.dumps({"model_type": "gemma3", "eos_token_id": [2, 5], "text_config": cj})
    )
    for f in (tmp_path / "wrapped").glob("*.safetensors"):
        t = safetensors.torch.load_file(str(f))
        renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in t.items()}
        safetensors.torch.save_file(renamed, str(f))
    text, wrapped = load_model(str(tmp_path / "text")), load_model(str(tmp_path / "wrapped"))
    assert wrapped.config == text.config
    a, b = text.model.weights.tensors(), wrapped.model.weights.tensors()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
