"""Test-side driver for ModelRunner: block bookkeeping and a tiny greedy scheduler (no engine needed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import triton.language as tl

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.executor.sampling import SamplingParams, SamplingState
from radixd.daemon.model import LayerWeights, LlamaModel, LlamaWeights, ModelConfig
from radixd.daemon.model.int4 import dequantize_int4, quantize_int4, scales_and_zeros
from radixd.daemon.model.precision import Precision

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "Q: What is 17 * 23?\nA:",
    "Les chats sont des animaux",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "1, 2, 3, 5, 8, 13,",
    "Translate to German: Good morning, how are you today?",
]


class BlockAlloc:
    """Hands out fresh physical block ids (block 0 is the null block)."""

    def __init__(self, num_blocks: int) -> None:
        self.next = 1
        self.num_blocks = num_blocks

    def alloc(self, n: int) -> list[int]:
        if self.next + n > self.num_blocks:
            raise RuntimeError("test pool exhausted")
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


@dataclass
class Req:
    prompt: list[int]
    n_new: int
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=64))
    start_pos: int = 0  # prompt tokens already in KV (shared prefix)
    blocks: list[int] = field(default_factory=list)  # blocks holding the shared prefix
    admit_step: int = 0
    chunk: int | None = None  # prefill chunk size (None = whole prompt at once)
    out: list[int] = field(default_factory=list)
    state: SamplingState | None = None
    done_prompt: int = 0


def run(runner: ModelRunner, alloc: BlockAlloc, reqs: list[Req]) -> list[list[int]]:
    """Drive `reqs` to completion with continuous batching; returns each request's generated ids."""
    bs = runner.block_size
    for i, r in enumerate(reqs):
        r.state = SamplingState(r.params, r.prompt)
        r.done_prompt = r.start_pos
        total = len(r.prompt) + r.n_new
        need = -(-total // bs)
        r.blocks = list(r.blocks) + alloc.alloc(need - len(r.blocks))
        r.out = []
        assert r.admit_step >= 0, i
    step = 0
    while any(len(r.out) < r.n_new for r in reqs):
        batch: list[tuple[Req, StepSeq]] = []
        for i, r in enumerate(reqs):
            if step < r.admit_step or len(r.out) >= r.n_new:
                continue
            if r.done_prompt < len(r.prompt):
                n = len(r.prompt) - r.done_prompt if r.chunk is None else r.chunk
                ids = r.prompt[r.done_prompt : r.done_prompt + n]
                final = r.done_prompt + len(ids) == len(r.prompt)
                seq = StepSeq(i, ids, r.done_prompt, r.blocks, r.state if final else None)
                r.done_prompt += len(ids)
            else:
                pos = len(r.prompt) + len(r.out) - 1
                seq = StepSeq(i, [r.out[-1]], pos, r.blocks, r.state)
            batch.append((r, seq))
        results = runner.step([s for _, s in batch])
        for (r, _), res in zip(batch, results, strict=True):
            if res is not None:
                assert r.state is not None
                r.state.append(res.token_id)
                r.out.append(res.token_id)
        step += 1
    return [r.out for r in reqs]


def tiny_model(
    seed: int = 0,
    vocab: int = 64,
    layers: int = 2,
    precision: Precision | None = None,
    q4_1: bool = False,
    bias: bool = False,
) -> LlamaModel:
    """A random in-memory Llama (GQA 4:2, head_dim 16) for runner tests that need no real weights
    (fp32 unless `precision` says otherwise). `q4_1`: the layers' matrices lie on a Q4_1 grid (4-bit
    codes per 32 inputs), as a Q4_1 GGUF ships them, so the int4 mode holds them exactly. `bias`: q/k/v
    and o biases, as Qwen-style checkpoints have."""
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return 0.2 * torch.randn(*shape, generator=g)

    def m(*shape: int) -> torch.Tensor:
        w = r(*shape)
        if not q4_1:
            return w
        q, d, lo = quantize_int4(w)
        return dequantize_int4(q, scales_and_zeros(d, lo, torch.float32))

    qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    lw = [
        LayerWeights(
            attn_norm=1 + r(64),
            qkv=m(qkv_rows, 64),
            qkv_bias=r(qkv_rows) if bias else None,
            o_proj=m(64, 64),
            o_bias=r(64) if bias else None,
            mlp_norm=1 + r(64),
            gate_up=m(192, 64),
            down=m(64, 96),
        )
        for _ in range(layers)
    ]
    embed = r(vocab, 64)
    weights = LlamaWeights(embed=embed, layers=lw, norm=1 + r(64), lm_head=embed)
    return LlamaModel(cfg, weights, precision=precision)


SAMPLING_VOCAB = 50  # the sampling tests' vocabulary


def random_logits(seed: int = 0, rows: int = 1) -> torch.Tensor:
    """Seeded logits [rows, SAMPLING_VOCAB], spread enough that top-k / top-p cut something."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, SAMPLING_VOCAB, generator=g) * 3


def hf_generate(model: Any, prompt: list[int], n_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :].tolist()]


@contextmanager
def triton_language_restored() -> Iterator[None]:
    """Leave `triton.language` as found: an interpreted kernel calling a `@triton.jit` helper leaves
    patches behind (Triton 3.9) that break a later real compile (tests/kernels/conftest.py)."""
    spaces = [tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base]
    saved = [dict(vars(ns)) for ns in spaces]
    try:
        yield
    finally:
        for ns, before in zip(spaces, saved, strict=True):
            for name in vars(ns).keys() - before.keys():
                delattr(ns, name)
            for name, value in before.items():
                if vars(ns).get(name) is not value:
                    setattr(ns, name, value)


def write_tiny_gemma3(path: Path, layer_types: list[str], window: int, vocab: int = 64) -> Path:
    """A random-weight Gemma 3 (transformers' classes, sliding and full layers as `layer_types` says)
    saved as a Hugging Face folder with a word-level tokenizer ("w0" .. "w{vocab-1}")."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        max_position_embeddings=256,
        sliding_window=window,
        layer_types=layer_types,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((0.1 if name.endswith("norm.weight") else 0.15) * torch.randn_like(p))
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return path
