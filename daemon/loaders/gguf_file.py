"""GGUF files: metadata -> ModelConfig, dequantized tensors -> our fused layout, vocabulary -> tokenizer.

NOTE: llama.cpp permutes Q and K rows for `llama` (interleaved RoPE); undone here for HF's rotate-half.
Its gemma3 files store every norm weight as 1 + w, the convention our model holds them in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from radixd.daemon.loaders.common import ConvertedModel, ModelLoadError
from radixd.daemon.loaders.tensor_names import MODEL_TENSORS, layer_tensors
from radixd.daemon.model import ModelConfig
from radixd.daemon.text.tokenizer import TextTokenizer, build_bpe_tokenizer, end_of_turn_ids

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
_PERMUTED_ARCHS = ("llama", "mistral")
# llama.cpp's gemma3 defaults: every 6th layer global, the others windowed with rope base 10000.
GEMMA3_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62  # its query scale is (hidden / heads) ** -0.5, not head_dim ** -0.5


def _open(path: str) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(path, "r")
    except FileNotFoundError as e:
        raise ModelLoadError(f"model file not found: {path}") from e
    except Exception as e:  # the reader raises ValueError, struct/numpy errors on damaged files
        raise ModelLoadError(f"{path} is not a valid GGUF file ({type(e).__name__}: {e})") from e


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _config(reader: Any, path: str, vocab: int) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(
            f"{path}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
        )

    def need(key: str) -> Any:
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    layers = int(need("block_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    scaling: dict[str, Any] | None = None
    kind = _field(reader, f"{arch}.rope.scaling.type")
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(_field(reader, f"{arch}.rope.scaling.factor", 1.0))}
    elif kind not in (None, "none"):
        raise ModelLoadError(f"{path}: rope scaling {kind!r} is not supported (supported: linear)")
    family: dict[str, Any] = {}
    if arch == "gemma3":
        family = _gemma3(reader, path, layers, hidden // heads if layers == GEMMA3_27B_LAYERS else head_dim)
        family["embed_scale"] = hidden**0.5
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 4096)),
        tie_word_embeddings=False,
        attention_bias=arch == "qwen2",
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        **family,
    )


def _gemma3(reader: Any, path: str, layers: int, query_dim: int) -> dict[str, Any]:
    """Gemma 3's fields as llama.cpp reads its GGUF (norm weights there already hold 1 + w)."""
    if _field(reader, "gemma3.final_logit_softcapping"):
        raise ModelLoadError(f"{path}: final logit softcapping is not supported (Gemma 3 has none)")
    window = int(_field(reader, "gemma3.attention.sliding_window", 0) or 0)
    windows: tuple[int, ...] = ()
    if window > 0:
        pattern = _field(reader, "gemma3.attention.sliding_window_pattern", GEMMA3_PATTERN)
        if isinstance(pattern, list):  # one flag a layer: windowed or not
            if len(pattern) != layers:
                raise ModelLoadError(
                    f"{path}: sliding_window_pattern has {len(pattern)} flags, {layers} layers"
                )
            windows = tuple(window if flag else 0 for flag in pattern)
        else:
            n = int(pattern)
            windows = tuple(window if n == 0 or i % n < n - 1 else 0 for i in range(layers))
    return {
        "activation": "gelu_tanh",
        "fp32_norms": True,
        "query_scale": query_dim**-0.5,
        "layer_windows": windows,
        "local_rope_theta": float(_field(reader, "gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
    }


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Invert llama.cpp's `permute`: rows (head, pair, 2) -> (head, 2, pair)."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).transpose(1, 2).reshape(out, *rest)


def _tokenizer(reader: Any, path: str) -> TextTokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(
            f"{path}: tokenizer type {model!r} is not supported (supported: 'gpt2' byte-level BPE)"
        )
    tokens = list(_field(reader, "tokenizer.ggml.tokens") or [])
    merges = list(_field(reader, "tokenizer.ggml.merges") or [])
    types = list(_field(reader, "tokenizer.ggml.token_type") or [])
    if not tokens or not merges:
        raise ModelLoadError(f"{path}: GGUF has no tokenizer vocabulary or merges")
    bpe = build_bpe_tokenizer(tokens, merges, types, _field(reader, "tokenizer.ggml.pre"))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    # As transformers does for byte-level GGUF vocabularies, encode() adds no BOS.
    return TextTokenizer(
        bpe,
        chat_template=_field(reader, "tokenizer.chat_template"),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=end_of_turn_ids(bpe, None if eos is None else int(eos)),
        add_bos=False,
    )


def convert_gguf(path: str) -> ConvertedModel:
    """Read, dequantize (with a progress bar) and re-layout a GGUF file."""
    import gguf.quants

    reader = _open(path)
    try:
        tok = _tokenizer(reader, path)
        by_name = {t.name: t for t in reader.tensors}
        embed = MODEL_TENSORS["embed"]["gguf"]
        if embed not in by_name:
            raise ModelLoadError(f"{path}: GGUF has no {embed} tensor")
        vocab = int(by_name[embed].shape[-1])
        cfg = _config(reader, path, vocab)
        arch = _field(reader, "general.architecture")
        raw: dict[str, torch.Tensor] = {}
        for t in tqdm(reader.tensors, desc=f"converting {path.rsplit('/', 1)[-1]}", unit="tensor"):
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
            raw[t.name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot convert GGUF tensors ({type(e).__name__}: {e})") from e
    top = {ours: names["gguf"] for ours, names in MODEL_TENSORS.items()}
    out: dict[str, torch.Tensor] = {"embed": raw[top["embed"]], "norm": raw[top["norm"]]}
    tied = top["lm_head"] not in raw
    if not tied:
        out["lm_head"] = raw[top["lm_head"]]
    extra: dict[str, object] = {"tie_word_embeddings": tied}
    if "rope_freqs.weight" in raw:
        if cfg.rope_scaling is not None:
            raise ModelLoadError(
                f"{path}: both rope scaling metadata and a rope_freqs tensor; cannot combine"
            )
        extra["rope_scaling"] = {"rope_type": "freq_factors", "factors": raw["rope_freqs.weight"].tolist()}
    cfg = ModelConfig.from_dict({**cfg.to_dict(), **extra})
    heads = (cfg.num_heads, cfg.num_kv_heads)

    def unpermute_qk(ours: str, index: int, part: torch.Tensor) -> torch.Tensor:
        if ours in ("qkv", "qkv_bias") and index < 2:
            return _unpermute(part, heads[index])
        return part

    fix = unpermute_qk if arch in _PERMUTED_ARCHS else None
    for i in range(cfg.num_layers):
        try:
            out.update(layer_tensors(raw, "gguf", i, fix))
        except KeyError as e:
            raise ModelLoadError(f"{path}: GGUF lacks tensor {e.args[0]}") from e
    return ConvertedModel(cfg, out, tok)
