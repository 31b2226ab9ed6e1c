"""GGUF files: metadata -> ModelConfig, tensors as stored -> our fused layout, vocabulary -> tokenizer.

NOTE: llama.cpp permutes Q and K rows for `llama` (interleaved RoPE); undone here for HF's rotate-half.
Its gemma3 files store every norm weight as 1 + w, the convention our model holds them in.
"""

from __future__ import annotations

from typing import Any

import torch

from radixd.daemon.loaders.common import ConvertedModel, ModelLoadError
from radixd.daemon.loaders.gguf_header import GGUFFormatError, GGUFHeader
from radixd.daemon.loaders.tensor_names import MODEL_TENSORS, layer_tensors
from radixd.daemon.model import ModelConfig
from radixd.daemon.model.stored import BLOCKS, FileMap, Stored, Weight, stored_from_file
from radixd.daemon.text.chat_formats import fallback_chat_template
from radixd.daemon.text.spm import build_spm_tokenizer
from radixd.daemon.text.tokenizer import TextTokenizer, build_bpe_tokenizer, end_of_turn_ids

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
_PERMUTED_ARCHS = ("llama", "mistral")
# llama.cpp's gemma3 defaults: every 6th layer global, the others windowed with rope base 10000.
GEMMA3_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62  # its query scale is (hidden / heads) ** -0.5, not head_dim ** -0.5


def _open(path: str) -> GGUFHeader:
    try:
        return GGUFHeader(path)
    except FileNotFoundError as e:
        raise ModelLoadError(f"model file not found: {path}") from e
    except (GGUFFormatError, OSError) as e:
        raise ModelLoadError(f"{path} is not a valid GGUF file: {e}") from e


def _field(reader: GGUFHeader, key: str, default: Any = None) -> Any:
    return reader.get(key, default)


def _type_name(type_id: int) -> str:
    """The GGUF type's name (Q4_K, F16, ...), or "type N" for one gguf-py does not know."""
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def _config(reader: GGUFHeader, path: str, vocab: int) -> ModelConfig:
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


def _tokenizer(reader: GGUFHeader, path: str) -> TextTokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    tokens = list(_field(reader, "tokenizer.ggml.tokens") or [])
    types = list(_field(reader, "tokenizer.ggml.token_type") or [])
    if model == "gpt2":
        merges = list(_field(reader, "tokenizer.ggml.merges") or [])
        if not tokens or not merges:
            raise ModelLoadError(f"{path}: GGUF has no tokenizer vocabulary or merges")
        tok = build_bpe_tokenizer(tokens, merges, types, _field(reader, "tokenizer.ggml.pre"))
        add_bos = False  # as transformers does for byte-level GGUF vocabularies
    elif model == "llama":
        scores = list(_field(reader, "tokenizer.ggml.scores") or [])
        if not tokens or len(scores) != len(tokens):
            raise ModelLoadError(f"{path}: GGUF has no SentencePiece vocabulary with a score per token")
        prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
        tok = build_spm_tokenizer(tokens, scores, types, prefix)
        add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", True))  # llama.cpp's default
    else:
        raise ModelLoadError(
            f"{path}: tokenizer type {model!r} is not supported"
            " (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)"
        )
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    turn_ends = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    return TextTokenizer(
        tok,
        chat_template=_field(reader, "tokenizer.chat_template")
        or fallback_chat_template(_field(reader, "general.architecture")),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=end_of_turn_ids(tok, None if eos is None else int(eos), turn_ends),
        add_bos=add_bos and bos is not None,
    )


def _read_tensors(reader: GGUFHeader, path: str) -> dict[str, Weight]:
    """Every tensor of the file: matrices as stored (mapped, not read), vectors as fp32."""
    fm = FileMap(path)
    raw: dict[str, Weight] = {}
    for t in reader.tensors:
        kind = _type_name(t.type_id)
        dims = list(t.dims)  # ggml order: the row length first
        if len(dims) == 1:
            vec = stored_from_file(fm, kind, (1, dims[0]), t.offset) if kind in BLOCKS else None
            if vec is None:
                raise ModelLoadError(f"{path}: tensor {t.name} is stored as {kind}; radixd does not read it")
            raw[t.name] = vec.dequantize()[0].clone()
            continue
        if len(dims) != 2:
            raise ModelLoadError(f"{path}: tensor {t.name} has {len(dims)} dimensions; radixd reads 1 or 2")
        if kind not in BLOCKS:
            raise ModelLoadError(
                f"{path}: tensor {t.name} is stored as {kind}, which radixd does not run "
                f"(supported: {', '.join(BLOCKS)}); requantize the file, e.g. to Q4_K_M"
            )
        raw[t.name] = (stored_from_file(fm, kind, (dims[1], dims[0]), t.offset),)
    return raw


def _unpermute_parts(parts: tuple[Stored, ...], n_head: int) -> tuple[Stored, ...]:
    """`_unpermute` on stored rows: the rows copied in HF's order, the mapped pages released."""
    out = []
    for p in parts:
        q = p.take_rows(_unpermute(torch.arange(p.rows), n_head))
        p.release()
        out.append(q)
    return tuple(out)


def convert_gguf(path: str) -> ConvertedModel:
    """Read a GGUF file: its config, tokenizer, and tensors in our fused layout, matrices as stored."""
    reader = _open(path)
    try:
        raw = _read_tensors(reader, path)
        tok = _tokenizer(reader, path)
        by_name = {t.name: t for t in reader.tensors}
        embed = MODEL_TENSORS["embed"]["gguf"]
        if embed not in by_name:
            raise ModelLoadError(f"{path}: GGUF has no {embed} tensor")
        vocab = int(by_name[embed].dims[-1])
        cfg = _config(reader, path, vocab)
        arch = _field(reader, "general.architecture")
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot read GGUF tensors ({type(e).__name__}: {e})") from e
    top = {ours: names["gguf"] for ours, names in MODEL_TENSORS.items()}
    out: dict[str, Weight] = {"embed": raw[top["embed"]], "norm": raw[top["norm"]]}
    tied = top["lm_head"] not in raw
    if not tied:
        out["lm_head"] = raw[top["lm_head"]]
    extra: dict[str, object] = {"tie_word_embeddings": tied}
    freqs = raw.get("rope_freqs.weight")
    if freqs is not None:
        if cfg.rope_scaling is not None:
            raise ModelLoadError(
                f"{path}: both rope scaling metadata and a rope_freqs tensor; cannot combine"
            )
        assert isinstance(freqs, torch.Tensor)
        extra["rope_scaling"] = {"rope_type": "freq_factors", "factors": freqs.tolist()}
    cfg = ModelConfig.from_dict({**cfg.to_dict(), **extra})
    heads = (cfg.num_heads, cfg.num_kv_heads)

    def unpermute_qk(ours: str, index: int, part: Weight) -> Weight:
        if ours not in ("qkv", "qkv_bias") or index >= 2:
            return part
        if isinstance(part, torch.Tensor):
            return _unpermute(part, heads[index])
        return _unpermute_parts(part, heads[index])

    fix = unpermute_qk if arch in _PERMUTED_ARCHS else None
    for i in range(cfg.num_layers):
        try:
            out.update(layer_tensors(raw, "gguf", i, fix))
        except KeyError as e:
            raise ModelLoadError(f"{path}: GGUF lacks tensor {e.args[0]}") from e
    return ConvertedModel(cfg, out, tok)
