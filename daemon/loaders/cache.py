"""On-disk cache of converted models, keyed by path, size, mtime and format version.

NOTE: entries are written to a temporary folder and renamed into place: never half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import safetensors.torch
from tokenizers import Tokenizer

from radixd.daemon.loaders.common import ConvertedModel
from radixd.daemon.model import ModelConfig
from radixd.daemon.text.tokenizer import TextTokenizer
from radixd.kernels.native import cache_root

CACHE_VERSION = 1


def cache_key(path: str) -> str:
    st = os.stat(path)
    ident = f"v{CACHE_VERSION}|{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def load_cached(path: str) -> ConvertedModel | None:
    """The cached conversion of `path`, or None (missing or unreadable entries are ignored)."""
    entry = cache_root() / cache_key(path)
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("version") != CACHE_VERSION:
            return None
        tensors = safetensors.torch.load_file(str(entry / "weights.safetensors"))
        bpe = Tokenizer.from_file(str(entry / "tokenizer.json"))
    except Exception:  # a damaged or foreign entry is a miss: the caller reconverts and overwrites it
        return None
    tok = TextTokenizer(
        bpe,
        chat_template=meta["chat_template"],
        bos_token_id=meta["bos_token_id"],
        eos_token_ids=meta["eos_token_ids"],
        add_bos=meta["add_bos"],
    )
    return ConvertedModel(ModelConfig.from_dict(meta["config"]), tensors, tok)


def store(path: str, conv: ConvertedModel) -> Path | None:
    """Write `conv` as the cache entry of `path`; returns the entry, or None if the cache is unwritable."""
    root = cache_root()
    entry = root / cache_key(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            tensors = {k: v.contiguous() for k, v in conv.tensors.items()}
            safetensors.torch.save_file(tensors, str(tmp / "weights.safetensors"))
            conv.tokenizer.tokenizer.save(str(tmp / "tokenizer.json"))
            meta = {
                "version": CACHE_VERSION,
                "source": os.path.abspath(path),
                "config": conv.config.to_dict(),
                "chat_template": conv.tokenizer.chat_template,
                "bos_token_id": conv.tokenizer.bos_token_id,
                "eos_token_ids": list(conv.tokenizer.eos_token_ids),
                "add_bos": conv.tokenizer.add_bos,
            }
            (tmp / "meta.json").write_text(json.dumps(meta))
            if entry.exists():
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        return None
    return entry
