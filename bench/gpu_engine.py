"""The engine end to end on a device (bench/gpu_check.py's first part): a random-weight model of the
embedded model's shape, made with no download, served by `EngineCore` with `device=` the GPU.

Greedy tokens: float32 on the device must equal the float32 CPU path's (the reference); the 16-bit
mode (bf16 on a GPU; fp16 in the dry run, where the interpreter's bf16 math is wrong) reports how
many leading tokens agree. Then decode tok/s at batch 1 and 64. The dry run serves a 2-layer model
with the Triton kernels under the interpreter (its timings prove only that the code runs).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from radixd.kernels import ENV_BACKEND

if TYPE_CHECKING:  # the daemon's modules load in `engine_check`: a missing dependency fails only it
    from radixd.daemon.engine.core import EngineCore
    from radixd.daemon.model.config import ModelConfig
    from radixd.daemon.model.llama import LlamaWeights
    from radixd.daemon.text.tokenizer import TextTokenizer

# SmolLM2-135M (the embedded model): its shape, from its GGUF.
SMOLLM2 = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "head_dim": 64,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
}
PROMPTS = 4  # prompts of the token comparison, each PROMPT_LEN random ids
PROMPT_LEN = 24
BLOCKS = 1024  # of 16 tokens: batch 64 x (25 + 64 tokens) fits with room to spare


@contextmanager
def _backend(name: str | None) -> Iterator[None]:
    """Kernels (and with them the model's projections) on `name`'s path for the block."""
    before = os.environ.get(ENV_BACKEND)
    if name is None:
        os.environ.pop(ENV_BACKEND, None)
    else:
        os.environ[ENV_BACKEND] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_BACKEND, None)
        else:
            os.environ[ENV_BACKEND] = before


def _tokenizer() -> TextTokenizer:
    """A byte-level tokenizer (256 ids): the engine needs one; requests skip detokenizing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from radixd.daemon.text.tokenizer import TextTokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return TextTokenizer(tok, eos_token_ids=(0,))


def _weights(cfg: ModelConfig, seed: int = 0) -> LlamaWeights:
    """Random fp32 weights on the CPU (a `LlamaModel` converts what it is given, so one set per model).
    The embedding's scale spreads the logits, so greedy picks are not near-ties."""
    from radixd.daemon.model.llama import LayerWeights, LlamaWeights

    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.05) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=g)

    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    layers = [
        LayerWeights(
            1 + r(h), r(qkv, h), None, r(h, cfg.num_heads * d), None, 1 + r(h), r(2 * inter, h), r(h, inter)
        )
        for _ in range(cfg.num_layers)
    ]
    embed = r(cfg.vocab_size, h, scale=1.0)
    return LlamaWeights(embed=embed, layers=layers, norm=1 + r(h), lm_head=embed)


def _serve(core: EngineCore, prompts: list[list[int]], new: int) -> tuple[list[list[int]], float]:
    """Greedy replies to `prompts`; -> (tokens, decode tok/s after every prompt's first token)."""
    from radixd.daemon.engine.types import GenerateRequest
    from radixd.daemon.executor.sampling import SamplingParams

    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        req = GenerateRequest(f"r{i}", p, params, detokenize=False)
        core.requests.add(req, lambda out: outs[out.request_id].extend(out.new_token_ids))
    while core.has_work() and not all(outs.values()):
        core.step()
    t0, first = time.perf_counter(), sum(map(len, outs.values()))
    core.run_until_idle()
    dt = time.perf_counter() - t0
    decoded = sum(map(len, outs.values())) - first
    return [outs[f"r{i}"] for i in range(len(prompts))], decoded / dt if dt > 0 else 0.0


def _leading(got: list[int], want: list[int]) -> int:
    """How many leading tokens of `got` equal `want`'s."""
    return next((j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), len(got))


def engine_check(add: Callable[..., None], failures: list[str], dev: torch.device, dry: bool) -> None:
    """Serve on `dev` and report through `add` (markdown lines); a failed requirement goes to `failures`."""
    from radixd.daemon.engine.config import EngineConfig
    from radixd.daemon.engine.factory import build_core
    from radixd.daemon.loaders import LoadedModel
    from radixd.daemon.model import LlamaModel
    from radixd.daemon.model.config import ModelConfig
    from radixd.daemon.model.precision import PRECISIONS, precision_of_dtype

    cfg = ModelConfig(**SMOLLM2)
    if dry:
        cfg = dataclasses.replace(cfg, **TINY)
    tok = _tokenizer()
    new, timed, wide = (3, 3, 4) if dry else (16, 64, 64)  # greedy tokens; timed tokens; the wide batch
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, cfg.vocab_size, (PROMPTS, PROMPT_LEN), generator=g).tolist()
    on = str(dev)
    add(
        f"## Engine (random weights, {cfg.num_layers} layers x {cfg.hidden_size}, on {on}; greedy)",
        "",
        f"| mode | where | tokens equal to the fp32 CPU path | decode tok/s batch 1 | batch {wide} |",
        "| --- | --- | --- | ---: | ---: |",
    )

    def core_for(prec_name: str, device: str) -> EngineCore:
        prec = PRECISIONS.get(prec_name) or precision_of_dtype(getattr(torch, prec_name))
        model = LlamaModel(cfg, _weights(cfg), device, prec)
        return build_core(
            LoadedModel(model, tok, cfg, "random"), EngineConfig(), num_blocks=BLOCKS, device=device
        )

    with _backend("torch"):
        ref, _ = _serve(core_for("float32", "cpu"), prompts, new)
    add("| float32 | cpu (torch twins) | reference | - | - |")
    for mode in ("float32", "float16" if dry else "bfloat16"):
        with _backend(None):
            core = core_for(mode, on)
            got, _ = _serve(core, prompts, new)
            _, one = _serve(core, prompts[:1], timed)
            batch = [prompts[i % PROMPTS] + [i] for i in range(wide)]
            if not dry:  # Triton compiles the wide batch's kernel variants outside the timed run
                _serve(core, batch, 2)
            _, many = _serve(core, batch, timed)
        same = [_leading(x, y) for x, y in zip(got, ref, strict=True)]
        agree = f"{sum(same)}/{new * PROMPTS} (leading, per prompt: {same})"
        if mode == "float32" and got != ref:
            failures.append(f"engine float32 on {on}: greedy tokens differ from the CPU path's {same}")
            agree += " FAIL"
        add(f"| {mode} | {on} (triton) | {agree} | {one:.0f} | {many:.0f} |")
    add("")
