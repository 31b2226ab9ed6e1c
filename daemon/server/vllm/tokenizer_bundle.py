"""The tokenizer bundle a gateway needs to tokenize and render chats the way the model does.

Built from the model's own tokenizer and chat template, with `tool_template`'s rendering of tool calls
where the template has none. `GetTokenizer` streams it as one zip; the files are also written to a local
directory that `GetModelInfo.tokenizer_path` reports. NOTE: the zip is deterministic, so its sha256 names
the content (the directory's key; replicas of one model report the same fingerprint).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixd.daemon.server.vllm.tool_template import with_tool_rendering

if TYPE_CHECKING:
    from radixd.daemon.model.config import ModelConfig
    from radixd.daemon.text.tokenizer import TextTokenizer

CHUNK_BYTES = 256 * 1024
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class TokenizerBundle:
    files: dict[str, bytes]
    zip_bytes: bytes
    sha256: str

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The zip in pieces of at most `size` bytes (at least one piece)."""
        data = self.zip_bytes
        for i in range(0, max(len(data), 1), size):
            yield data[i : i + size]


def _token(tok: TextTokenizer, token_id: int | None) -> str | None:
    return tok.id_to_token(token_id) if token_id is not None else None


def bundle_files(tok: TextTokenizer, config: ModelConfig, context_length: int) -> dict[str, bytes]:
    """The bundle's files: the tokenizer as `tokenizers` serializes it, plus the HF-style configs."""
    eos = list(tok.eos_token_ids) or list(config.eos_token_ids)
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token(tok, tok.bos_token_id),
        "eos_token": _token(tok, eos[0]) if eos else None,
        "add_bos_token": bool(tok.add_bos),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    template = with_tool_rendering(tok.chat_template) if tok.chat_template else None
    if template:
        tok_config["chat_template"] = template
    model_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "max_position_embeddings": context_length,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
    }
    files = {
        "tokenizer.json": tok.tokenizer.to_str().encode(),
        "tokenizer_config.json": json.dumps(tok_config, indent=2, sort_keys=True).encode(),
        "config.json": json.dumps(model_config, indent=2, sort_keys=True).encode(),
    }
    if template:
        files["chat_template.jinja"] = template.encode()
    return files


def build_bundle(tok: TextTokenizer, config: ModelConfig, context_length: int) -> TokenizerBundle:
    files = bundle_files(tok, config, context_length)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name])
    data = buf.getvalue()
    return TokenizerBundle(files, data, hashlib.sha256(data).hexdigest())


def write_dir(bundle: TokenizerBundle, root: str | None = None) -> Path:
    """The bundle's files in `<root>/radixd-tokenizer-<sha256 prefix>` (written once, atomically)."""
    base = Path(root or tempfile.gettempdir())
    target = base / f"radixd-tokenizer-{bundle.sha256[:16]}"
    if all((target / name).is_file() for name in bundle.files):
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".radixd-tokenizer-", dir=base))
    for name, data in bundle.files.items():
        (staging / name).write_bytes(data)
    os.chmod(staging, 0o755)
    try:
        staging.rename(target)
    except OSError:  # another daemon wrote the same content first
        for name in bundle.files:
            (staging / name).unlink()
        staging.rmdir()
    return target
