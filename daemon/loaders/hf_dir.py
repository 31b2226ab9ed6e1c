"""Hugging Face model directories: config.json + *.safetensors + tokenizer.json (+ chat template)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from tokenizers import Tokenizer

from radixd.daemon.loaders.common import ConvertedModel, ModelLoadError
from radixd.daemon.loaders.tensor_names import MODEL_TENSORS, layer_tensors
from radixd.daemon.model import ModelConfig
from radixd.daemon.model.stored import Weight
from radixd.daemon.text.tokenizer import TextTokenizer, end_of_turn_ids

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ModelLoadError(f"model directory lacks {path.name}: {path}") from e
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    return data


def _config(d: Path, cj: dict[str, Any]) -> ModelConfig:
    mtype = cj.get("model_type", "llama")
    if mtype not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"{d / 'config.json'}: model_type {mtype!r} is not supported ({SUPPORTED_TYPES})"
        )
    rope = dict(cj.get("rope_parameters") or cj.get("rope_scaling") or {})
    theta = float(cj.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = None if kind == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
    eos = cj.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    heads = int(cj["num_attention_heads"])
    try:
        return ModelConfig(
            vocab_size=int(cj["vocab_size"]),
            hidden_size=int(cj["hidden_size"]),
            intermediate_size=int(cj["intermediate_size"]),
            num_layers=int(cj["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cj.get("num_key_value_heads") or heads),
            head_dim=int(cj.get("head_dim") or int(cj["hidden_size"]) // heads),
            rms_norm_eps=float(cj.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cj.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cj.get("tie_word_embeddings", False)),
            attention_bias=bool(cj.get("attention_bias", mtype == "qwen2")),
            bos_token_id=cj.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
    except KeyError as e:
        raise ModelLoadError(f"{d / 'config.json'} lacks {e.args[0]}") from e


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
    return {k: v.float() for k, v in out.items()}


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
    cfg = _config(d, _read_json(d / "config.json"))
    raw = _tensors(d)
    tok = _tokenizer(d, cfg)
    top = {ours: names["hf"] for ours, names in MODEL_TENSORS.items()}
    out: dict[str, Weight] = {}
    try:
        out["embed"] = raw[top["embed"]]
        out["norm"] = raw[top["norm"]]
        if not cfg.tie_word_embeddings:
            out["lm_head"] = raw[top["lm_head"]]
        for i in range(cfg.num_layers):
            out.update(layer_tensors(raw, "hf", i))
    except KeyError as e:
        raise ModelLoadError(f"{d}: safetensors lack tensor {e.args[0]}") from e
    return ConvertedModel(cfg, out, tok)
