"""Hugging Face model directories: config.json + *.safetensors + tokenizer.json (+ chat template)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from tokenizers import Tokenizer

from radixd.daemon.loaders.common import ConvertedModel, ModelLoadError
from radixd.daemon.loaders.tensor_names import HF_SANDWICH, MODEL_TENSORS, layer_tensors
from radixd.daemon.model import ModelConfig
from radixd.daemon.model.stored import Weight
from radixd.daemon.text.tokenizer import TextTokenizer, end_of_turn_ids

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma3")
GEMMA_TYPES = ("gemma3_text", "gemma3")
# Where a multimodal gemma3 checkpoint keeps its text model's tensors (transformers 5, then 4).
_TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.", "language_model.": ""}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ModelLoadError(f"model directory lacks {path.name}: {path}") from e
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    return data


def _rope(params: dict[str, Any], default_theta: float) -> tuple[float, dict[str, Any] | None]:
    """(rope base, scaling or None) from an HF rope dict (`rope_parameters` / `rope_scaling` form)."""
    theta = float(params.get("rope_theta") or default_theta)
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, None if kind == "default" else {k: v for k, v in params.items() if k != "rope_theta"}


def _gemma3(where: Path, cj: dict[str, Any], layers: int) -> dict[str, Any]:
    """Gemma 3's fields (its norms' 1 + w is folded into the weights by `convert_hf_dir`)."""
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cj.get(cap) is not None:
            raise ModelLoadError(f"{where}: {cap} is not supported (Gemma 3 has none)")
    if cj.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(f"{where}: hidden_activation {cj['hidden_activation']!r} is not supported")
    if cj.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{where}: bidirectional attention is not supported (a decoder only)")
    types = cj.get("layer_types")
    if not types:
        n = int(cj.get("sliding_window_pattern") or 6)
        types = ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers)]
    window = int(cj.get("sliding_window") or 0)
    params = cj.get("rope_parameters") or {}
    local = params.get("sliding_attention") or {"rope_theta": cj.get("rope_local_base_freq", 10000.0)}
    glob = params.get("full_attention") or {
        **(cj.get("rope_scaling") or {}),
        "rope_theta": cj.get("rope_theta"),
    }
    theta, scaling = _rope(glob, 1_000_000.0)
    local_theta, local_scaling = _rope(local, 10000.0)
    if local_scaling is not None:
        raise ModelLoadError(f"{where}: rope scaling on the sliding-window layers is not supported")
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "activation": "gelu_tanh",
        "fp32_norms": True,
        "embed_scale": float(cj["hidden_size"]) ** 0.5,
        "query_scale": float(cj.get("query_pre_attn_scalar", 256)) ** -0.5,
        "layer_windows": tuple(window if t == "sliding_attention" else 0 for t in types) if window else (),
        "local_rope_theta": local_theta,
        "tie_word_embeddings": bool(cj.get("tie_word_embeddings", True)),
    }


def _config(d: Path, cj: dict[str, Any]) -> ModelConfig:
    where = d / "config.json"
    mtype = cj.get("model_type", "llama")
    if mtype not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"{where}: model_type {mtype!r} is not supported (supported: {', '.join(SUPPORTED_TYPES)})"
        )
    if mtype == "gemma3":  # the multimodal wrapper: its text model's config, ids from either
        cj = {k: v for k, v in cj.items() if k != "text_config"} | dict(cj.get("text_config") or {})
    theta, scaling = _rope(dict(cj.get("rope_parameters") or cj.get("rope_scaling") or {}), 0.0)
    eos = cj.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    if cj.get("use_sliding_window"):
        raise ModelLoadError(f"{where}: use_sliding_window (windows on some Qwen layers) is not supported")
    try:
        heads = int(cj["num_attention_heads"])
        layers = int(cj["num_hidden_layers"])
        window = int(cj.get("sliding_window") or 0) if mtype == "mistral" else 0
        family: dict[str, Any] = {
            "rope_theta": float(cj.get("rope_theta") or theta or 10000.0),
            "rope_scaling": scaling,
            "tie_word_embeddings": bool(cj.get("tie_word_embeddings", False)),
            "layer_windows": (window,) * layers if window else (),
        }
        if mtype in GEMMA_TYPES:
            family = _gemma3(where, cj, layers)
        return ModelConfig(
            vocab_size=int(cj["vocab_size"]),
            hidden_size=int(cj["hidden_size"]),
            intermediate_size=int(cj["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cj.get("num_key_value_heads") or heads),
            head_dim=int(cj.get("head_dim") or int(cj["hidden_size"]) // heads),
            rms_norm_eps=float(cj.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cj.get("max_position_embeddings", 4096)),
            attention_bias=bool(cj.get("attention_bias", mtype == "qwen2")),
            bos_token_id=cj.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **family,
        )
    except KeyError as e:
        raise ModelLoadError(f"{where} lacks {e.args[0]}") from e


def _tensors(d: Path) -> dict[str, torch.Tensor]:
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model directory has no *.safetensors files: {d}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            out.update(safetensors.torch.load_file(str(f)))
        except Exception as e:
            raise ModelLoadError(f"{f} is not a valid safetensors file ({type(e).__name__}: {e})") from e
    for prefix, ours in _TEXT_PREFIXES.items():
        out = {(ours + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in out.items()}
    # Matrices stay in their stored dtype (a bf16 checkpoint is not widened; each precision converts
    # per matrix); vectors (norms, biases) are read as fp32, as the model computes with them.
    return {k: v if v.dim() >= 2 else v.float() for k, v in out.items()}


def _tokenizer(d: Path, cfg: ModelConfig) -> TextTokenizer:
    tj = d / "tokenizer.json"
    if not tj.exists():
        raise ModelLoadError(f"model directory lacks tokenizer.json: {d}")
    try:
        bpe = Tokenizer.from_file(str(tj))
    except Exception as e:
        raise ModelLoadError(f"{tj} is not a valid tokenizer.json ({e})") from e
    tc: dict[str, Any] = (
        _read_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").exists() else {}
    )
    template = tc.get("chat_template")
    if (d / "chat_template.jinja").exists():
        template = (d / "chat_template.jinja").read_text()
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else None
    ids = list(end_of_turn_ids(bpe, eos))
    ids += [e for e in cfg.eos_token_ids if e not in ids]
    # tokenizer.json's post-processor adds BOS itself where the model wants it.
    return TextTokenizer(bpe, template if isinstance(template, str) else None, cfg.bos_token_id, ids, False)


def convert_hf_dir(path: str) -> ConvertedModel:
    d = Path(path)
    cj = _read_json(d / "config.json")
    cfg = _config(d, cj)
    gemma = cj.get("model_type") in GEMMA_TYPES
    raw = _tensors(d)
    if gemma:  # Gemma's RMSNorm scales by 1 + w: held as such, as llama.cpp's GGUFs store it
        raw = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in raw.items()}
    tok = _tokenizer(d, cfg)
    top = {ours: names["hf"] for ours, names in MODEL_TENSORS.items()}
    out: dict[str, Weight] = {}
    try:
        out["embed"] = raw[top["embed"]]
        out["norm"] = raw[top["norm"]]
        if not cfg.tie_word_embeddings:
            out["lm_head"] = raw[top["lm_head"]]
        for i in range(cfg.num_layers):
            out.update(layer_tensors(raw, "hf", i, names_of=HF_SANDWICH if gemma else None))
    except KeyError as e:
        raise ModelLoadError(f"{d}: safetensors lack tensor {e.args[0]}") from e
    return ConvertedModel(cfg, out, tok)
