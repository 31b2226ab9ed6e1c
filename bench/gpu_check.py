"""GPU check for radixd: the engine serving end to end on the device (random weights), the kernels'
correctness sweep (fp16, bf16, a pool over 4 GiB), then a decode bandwidth sweep against a
device-to-device copy and SDPA on a contiguous cache. Writes a markdown report to $OUT/gpu.md (or
docs/gpu.md).

    bash bench/gpu_check.sh               # on a CUDA machine (H100/H200), < 8 minutes
    python bench/gpu_check.py --dry-run   # on CPU under TRITON_INTERPRET=1, tiny shapes (tests use it)

Timing: triton.testing.do_bench_cudagraph medians (CUDA graphs hide launch overhead). Bandwidth is
K+V bytes read per decode call / time; the copy reference counts bytes read + written.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixd.kernels import ENV_BACKEND, copy_blocks, paged_decode, paged_prefill, store_kv
from radixd.kernels.paged_decode import DECODE_CONFIG, SPLIT_TOKENS

if TYPE_CHECKING:  # the daemon's modules load in `engine_check`: a missing dependency skips only it
    from radixd.daemon.engine.core import EngineCore
    from radixd.daemon.model.config import ModelConfig
    from radixd.daemon.model.llama import LlamaWeights
    from radixd.daemon.text.tokenizer import TextTokenizer

ROOT = Path(__file__).resolve().parent.parent

TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (1.5e-2, 1e-2),  # atol, rtol
}
SHAPES = {"SmolLM2-135M": (9, 3, 64), "Llama-3-8B": (32, 8, 128)}


@dataclass
class Report:
    path: Path
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def flush(self) -> None:
        """Write what we have so far (a timeout still leaves a partial report)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(self.lines) + "\n")


# ----------------------------------------------------------------------------------------------
# The engine end to end on the device: a random-weight model of the embedded model's shape (no
# download) served by `EngineCore`. float32 on the device must give the float32 CPU path's greedy
# tokens; the 16-bit mode (bf16; fp16 in the dry run, where the interpreter's bf16 math is wrong)
# reports how many leading tokens agree; then decode tok/s at batch 1 and 64.
# ----------------------------------------------------------------------------------------------

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


def engine_check(report: Report, dev: torch.device, dry: bool) -> None:
    """Serve on `dev` (the module section's comment) and report; a failed requirement is a failure."""
    from radixd.daemon.engine.config import EngineConfig
    from radixd.daemon.engine.factory import build_core
    from radixd.daemon.loaders import LoadedModel
    from radixd.daemon.model import LlamaModel
    from radixd.daemon.model.config import ModelConfig
    from radixd.daemon.model.precision import PRECISIONS, precision_of_dtype

    cfg = ModelConfig(**SMOLLM2)
    if dry:
        cfg = replace(cfg, **TINY)
    tok = _tokenizer()
    new, timed, wide = (3, 3, 4) if dry else (16, 64, 64)  # greedy tokens; timed tokens; the wide batch
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, cfg.vocab_size, (PROMPTS, PROMPT_LEN), generator=g).tolist()
    on = str(dev)
    report.add(
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
    report.add("| float32 | cpu (torch twins) | reference | - | - |")
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
            report.failures.append(f"engine float32 on {on}: greedy tokens differ from the CPU path's {same}")
            agree += " FAIL"
        report.add(f"| {mode} | {on} (triton) | {agree} | {one:.0f} | {many:.0f} |")
    report.add("")


# ----------------------------------------------------------------------------------------------
# float64 references: token-by-token gather through the table (independent of the kernels)
# ----------------------------------------------------------------------------------------------


def _gather_tokens(cache: torch.Tensor, tables: torch.Tensor, length: int) -> torch.Tensor:
    b = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    blk = tables.long()[:, pos // b]  # [S, L]
    return cache[blk, (pos % b)[None, :].expand_as(blk)].double()  # [S, L, Hkv, D]


def ref_attention(
    q: torch.Tensor,  # [S, M, Hq, D] (M query rows per sequence)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    q_pos: torch.Tensor,  # [S, M] position of each query row; keys <= q_pos are visible
    lens: torch.Tensor,  # [S]
) -> torch.Tensor:
    hq, d = q.shape[2], q.shape[3]
    hkv = k_cache.shape[2]
    length = max(int(lens.max()), 1)
    k = _gather_tokens(k_cache, tables, length).repeat_interleave(hq // hkv, dim=2)
    v = _gather_tokens(v_cache, tables, length).repeat_interleave(hq // hkv, dim=2)
    sc = torch.einsum("smhd,slhd->shml", q.double(), k) / math.sqrt(d)
    pos = torch.arange(length, device=q.device)
    ok = (pos[None, None, :] <= q_pos[:, :, None]) & (pos[None, None, :] < lens[:, None, None].long())
    sc = sc.masked_fill(~ok[:, None], float("-inf"))
    p = torch.softmax(sc, dim=-1).nan_to_num(0.0)
    v = v.masked_fill((pos[None, :] >= lens[:, None].long())[:, :, None, None], 0.0)
    return torch.einsum("shml,slhd->smhd", p, v)


def make_pool(
    lens: list[int],
    b: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    dev: torch.device,
    first_block: int = 1,
    num_blocks: int | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pool with shuffled tables drawn from [first_block, num_blocks); only used blocks are filled."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    need = [max(1, -(-n // b)) for n in lens]
    n = num_blocks if num_blocks is not None else first_block + sum(need) + 2
    # NOTE: zeros, not empty: padded table entries point at block 0, which must hold finite data.
    k = torch.zeros(n, b, hkv, d, dtype=dtype, device=dev)
    v = torch.zeros(n, b, hkv, d, dtype=dtype, device=dev)
    picks = torch.randperm(n - first_block, generator=g)[: sum(need)] + first_block
    tables = torch.zeros(len(lens), max(need) + 1, dtype=torch.int32)
    at = 0
    for i, c in enumerate(need):
        tables[i, :c] = picks[at : at + c].to(torch.int32)
        at += c
    used = picks.to(dev)
    k[used] = torch.randn(used.numel(), b, hkv, d, generator=g).to(dtype).to(dev)
    v[used] = torch.randn(used.numel(), b, hkv, d, generator=g).to(dtype).to(dev)
    return k, v, tables.to(dev)


def _err_row(
    op: str, dtype: torch.dtype, what: str, got: torch.Tensor, want: torch.Tensor
) -> tuple[str, bool]:
    atol, rtol = TOL[dtype]
    diff = (got.double() - want).abs()
    bound = atol + rtol * want.abs()
    ok = bool((diff <= bound).all()) and bool(torch.isfinite(got).all())
    err = float(diff.max()) if diff.numel() else 0.0
    name = str(dtype).removeprefix("torch.")
    return (
        f"| {op} | {name} | {what} | {err:.2e} | {'ok' if ok else 'FAIL'} |",
        ok,
    )


def check_decode(
    dev: torch.device,
    dtype: torch.dtype,
    shape: tuple[int, int, int, int],
    lens: list[int],
    label: str = "",
    **pool_kw: int,
) -> list[tuple[str, bool]]:
    hq, hkv, d, b = shape
    k, v, tables = make_pool(lens, b, hkv, d, dtype, dev, **pool_kw)
    q = torch.randn(len(lens), hq, d, device=dev).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    want = ref_attention(q[:, None], k, v, tables, (seq_lens - 1).long()[:, None], seq_lens)[:, 0]
    rows = []
    for splits in (None, 64, 128, 512) if dev.type == "cuda" else (None, 64):
        got = paged_decode(
            q, k, v, tables, seq_lens, 1.0 / math.sqrt(d), split_tokens=splits, backend="triton"
        )
        what = f"Hq{hq}/Hkv{hkv} D{d} B{b} lens={_short(lens)} splits={splits or 'auto'}{label}"
        rows.append(_err_row("decode", dtype, what, got, want))
    return rows


def check_prefill(
    dev: torch.device,
    dtype: torch.dtype,
    shape: tuple[int, int, int, int],
    lens: list[int],
    q_lens: list[int],
    label: str = "",
    **pool_kw: int,
) -> list[tuple[str, bool]]:
    hq, hkv, d, b = shape
    k, v, tables = make_pool(lens, b, hkv, d, dtype, dev, **pool_kw)
    t = sum(q_lens)
    q = torch.randn(t, hq, d, device=dev).to(dtype)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    got = paged_prefill(q, k, v, tables, cu.to(dev), seq_lens, 1.0 / math.sqrt(d), backend="triton")
    # Reference: pad each sequence's rows to max q_len.
    m = max(max(q_lens), 1)
    qp = torch.zeros(len(lens), m, hq, d, dtype=dtype, device=dev)
    q_pos = torch.zeros(len(lens), m, dtype=torch.long, device=dev)
    for s, (ql, sl) in enumerate(zip(q_lens, lens, strict=True)):
        qp[s, :ql] = q[int(cu[s]) : int(cu[s]) + ql]
        q_pos[s] = torch.arange(m, device=dev) + (sl - ql)
    ref = ref_attention(qp, k, v, tables, q_pos, seq_lens)
    want = torch.cat([ref[s, :ql] for s, ql in enumerate(q_lens)]) if t else ref[:0, 0]
    return [
        _err_row(
            "prefill", dtype, f"Hq{hq}/Hkv{hkv} D{d} B{b} q={_short(q_lens)} kv={_short(lens)}", got, want
        )
    ]


def check_store_copy(
    dev: torch.device, dtype: torch.dtype, pool_blocks: int, first_high: int
) -> list[tuple[str, bool]]:
    """store_kv and copy_blocks on a pool whose upper blocks sit past 2^31 elements (int64 offsets)."""
    b, hkv, d = 16, 8, 128
    kc = torch.zeros(pool_blocks, b, hkv, d, dtype=dtype, device=dev)
    vc = torch.zeros_like(kc)
    hi = [first_high + 3, pool_blocks - 1]
    slots = torch.tensor([hi[0] * b + 5, -1, hi[1] * b + 15, 2 * b + 1], dtype=torch.int64, device=dev)
    kn = torch.randn(4, hkv, d, device=dev).to(dtype)
    vn = torch.randn(4, hkv, d, device=dev).to(dtype)
    store_kv(kn, vn, kc, vc, slots, backend="triton")
    ok = all(
        bool(torch.equal(kc[s // b, s % b], kn[i])) and bool(torch.equal(vc[s // b, s % b], vn[i]))
        for i, s in enumerate(slots.tolist())
        if s >= 0
    )
    ok = ok and float(kc[hi[0], 4].abs().sum()) == 0.0  # neighbour slot untouched
    name = str(dtype).removeprefix("torch.")
    rows = [
        (f"| store_kv | {name} | slots past 2^31 elements, -1 skipped | 0 | {'ok' if ok else 'FAIL'} |", ok)
    ]
    src_hi, dst_lo, src_lo, dst_hi = hi[0], 5, 2, hi[1] - 1
    before = kc[[src_hi, src_lo]].clone()
    ops = torch.tensor([[src_hi, dst_lo, 16], [src_lo, dst_hi, 3]], dtype=torch.int64)
    copy_blocks([kc], [vc], [kc], [vc], ops, backend="triton")
    ok = bool(torch.equal(kc[dst_lo], before[0])) and bool(torch.equal(kc[dst_hi, :3], before[1, :3]))
    ok = ok and bool(torch.equal(kc[[src_hi, src_lo]], before)) and float(kc[dst_hi, 3:].abs().sum()) == 0.0
    rows.append(
        (f"| copy_blocks | {name} | CoW across the 2^31-element mark | 0 | {'ok' if ok else 'FAIL'} |", ok)
    )
    if dev.type == "cuda":  # swap to a pinned host pool and back
        host = torch.zeros(4, b, hkv, d, dtype=dtype).pin_memory()
        copy_blocks([kc], [vc], [host], [host.clone()], torch.tensor([[src_hi, 1, 16]]))
        ok = bool(torch.equal(host[1], kc[src_hi].cpu()))
        rows.append(
            (f"| copy_blocks | {name} | device -> pinned host pool | 0 | {'ok' if ok else 'FAIL'} |", ok)
        )
    return rows


def _short(xs: list[int]) -> str:
    return ",".join(map(str, xs[:6])) + (",..." if len(xs) > 6 else "")


def correctness(report: Report, dev: torch.device, dry: bool) -> None:
    report.add("## Correctness (Triton vs float64 reference gathered through the block table)", "")
    report.add("| op | dtype | case | max abs err | result |", "| --- | --- | --- | ---: | --- |")
    dtypes = [torch.float32, torch.float16] if dry else [torch.float16, torch.bfloat16]
    if dry:
        cases = [(9, 3, 64, 16), (16, 2, 128, 8)]
        long_lens, long_q = [40, 17], [5, 17]
    else:
        cases = [(9, 3, 64, 16), (32, 8, 128, 16), (8, 8, 80, 1), (64, 8, 128, 64), (12, 4, 80, 7)]
        long_lens, long_q = [3000, 1000, 257], [600, 128, 100]
    rows: list[tuple[str, bool]] = []
    for i, dtype in enumerate(dtypes):
        for hq, hkv, d, b in cases[i::2] if dry else cases:
            shape = (hq, hkv, d, b)
            lens = [*long_lens, b + 1, b, max(b - 1, 1), 1, 0]
            q_lens = [*long_q, b + 1, 1, 0, 1, 0]
            q_lens = [min(n, ql) for n, ql in zip(lens, q_lens, strict=True)]
            rows += _guard(f"decode {shape}", check_decode, dev, dtype, shape, lens)
            rows += _guard(f"prefill {shape}", check_prefill, dev, dtype, shape, lens, q_lens)
        # Pool over 4 GiB: blocks past 2^31 elements need int64 offsets in every kernel.
        block_elems = 16 * 8 * 128
        first_high = (2**31 // block_elems) if not dry else 64
        pool_blocks = first_high + (2048 if not dry else 16)
        label = f" pool {pool_blocks * block_elems * dtype.itemsize / 2**30:.2f} GiB"
        big = {"first_block": first_high, "num_blocks": pool_blocks}
        lens = [700, 33] if not dry else [40, 3]
        llama = (32, 8, 128, 16)
        rows += _guard("decode big pool", check_decode, dev, dtype, llama, lens, label, **big)
        rows += _guard(
            "prefill big pool", check_prefill, dev, dtype, llama, lens, [lens[0] // 2, 1], label, **big
        )
        rows += _guard("store/copy big pool", check_store_copy, dev, dtype, pool_blocks, first_high)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for line, ok in rows:
        report.add(line)
        if not ok:
            report.failures.append(line)
    report.add("", f"{sum(ok for _, ok in rows)}/{len(rows)} checks passed.", "")
    report.flush()


def _guard(
    what: str, fn: Callable[..., list[tuple[str, bool]]], *args: Any, **kw: Any
) -> list[tuple[str, bool]]:
    """Run one check; an exception becomes a FAIL row instead of ending the sweep."""
    try:
        return fn(*args, **kw)
    except Exception as exc:
        traceback.print_exc()
        msg = f"{type(exc).__name__}: {exc}".replace("|", "/").replace("\n", " ")[:200]
        return [(f"| {what} | - | raised | - | FAIL: {msg} |", False)]


# ----------------------------------------------------------------------------------------------
# bandwidth sweep
# ----------------------------------------------------------------------------------------------


def bench_ms(fn: Callable[[], object], dry: bool) -> float:
    """Median ms per call: CUDA-graph replay on a GPU, wall clock under the interpreter."""
    if dry:  # one wall-clock call: this only proves the code path runs
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))
    except Exception:  # a capture failure should cost one number's method, not the whole sweep
        traceback.print_exc()
        _FALLBACKS.append(getattr(fn, "__name__", "fn"))
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, rep=30, return_mode="median"))


_FALLBACKS: list[str] = []


def copy_bandwidth(dev: torch.device, dry: bool) -> float:
    """Device-to-device copy GB/s (bytes read + written) on a 2 GiB buffer."""
    n = (2 << 30) if not dry else (8 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), dry)
    return 2 * n / (ms * 1e-3) / 1e9


@dataclass
class Sweep:
    """Which bandwidth configurations to time (a rerun of a part names it on the command line)."""

    models: list[str]
    batches: list[int]
    ctxs: list[int]


def _progress(what: str) -> None:
    """One stdout line per step, so a run killed from outside still shows where it was."""
    print(f"[{time.monotonic() - _START:6.1f} s] {what}", flush=True)


_START = time.monotonic()


def bandwidth(report: Report, dev: torch.device, dry: bool, deadline: float, sweep: Sweep) -> None:
    copy_gbs = copy_bandwidth(dev, dry)
    report.add(
        "## Decode bandwidth (page 16, shuffled blocks; fp16)",
        "",
        f"Device-to-device copy, same run: **{copy_gbs:.0f} GB/s** (bytes read + written). Decode GB/s = "
        "K+V bytes read / median time. `one block` = the same kernel with one block spanning the whole "
        "context; `SDPA` = torch SDPA on a contiguous [S, Hkv, L, D] cache of the same data (best of the "
        "enable_gqa form and the GQA-heads-as-query-rows form). Ratios > 1 mean page 16 is slower.",
        "",
        "| model | batch | ctx | K+V MiB | splits | page16 us | GB/s | % copy "
        "| one block us | p16/one | SDPA us | p16/SDPA |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    )
    report.flush()
    if dry:
        batches, ctxs = [2], [64]
    else:
        batches, ctxs = sweep.batches, sweep.ctxs
    cap = 12 << 30  # K+V bytes per config (the contiguous copy doubles it)
    big: list[tuple[float, float, float, float]] = []
    skipped = 0
    for model, (hq, hkv, d) in SHAPES.items():
        if sweep.models and model not in sweep.models:
            continue
        for ctx in ctxs:
            for batch in batches:
                kv_bytes = 2 * batch * ctx * hkv * d * 2
                if kv_bytes > cap:
                    continue
                if time.monotonic() > deadline:
                    skipped += 1
                    continue
                _progress(f"bandwidth {model} {batch}x{ctx}")
                try:
                    row, stats = _bench_one(dev, dry, model, hq, hkv, d, batch, ctx, copy_gbs)
                except Exception as exc:
                    traceback.print_exc()
                    report.add(f"| {model} | {batch} | {ctx} | - | - | raised {type(exc).__name__}: {exc} |")
                    report.failures.append(f"bandwidth {model} {batch}x{ctx}: {exc}")
                    continue
                report.add(row)
                if kv_bytes >= 512 << 20:
                    big.append(stats)
                report.flush()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    report.add("")
    if skipped:
        report.add(f"{skipped} configurations skipped: time budget reached.", "")
    if big:
        frac = min(s[0] for s in big)
        one = max(s[1] for s in big)
        sdpa = max(s[2] for s in big)
        report.add(
            "Targets over configurations with >= 512 MiB of K+V:",
            "",
            f"- >= 85% of copy bandwidth: worst {frac * 100:.0f}% -> {'met' if frac >= 0.85 else 'NOT met'}",
            f"- within 1.15x of contiguous SDPA: worst {sdpa:.2f}x -> {'met' if sdpa <= 1.15 else 'NOT met'}",
            f"- page 16 <= 5% slower than one block: worst {one:.2f}x -> "
            f"{'met' if one <= 1.05 else 'NOT met'}",
            "",
        )
    report.flush()


def _bench_one(
    dev: torch.device, dry: bool, model: str, hq: int, hkv: int, d: int, batch: int, ctx: int, copy_gbs: float
) -> tuple[str, tuple[float, float, float, float]]:
    import torch.nn.functional as F

    page = 16
    nb = ctx // page
    n = batch * nb + 1
    dtype = torch.float16
    k = torch.randn(n, page, hkv, d, dtype=dtype, device=dev)
    v = torch.randn(n, page, hkv, d, dtype=dtype, device=dev)
    perm = torch.randperm(n - 1, device=dev) + 1
    tables = perm[: batch * nb].view(batch, nb).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, dtype=dtype, device=dev)
    scale = 1.0 / math.sqrt(d)
    splits = -(-nb * page // SPLIT_TOKENS)
    t16 = bench_ms(lambda: paged_decode(q, k, v, tables, lens, scale, backend="triton"), dry)
    # One block per sequence spanning the context: the same storage viewed as [batch, ctx, Hkv, D].
    k1 = k[1:].view(batch, ctx, hkv, d)
    v1 = v[1:].view(batch, ctx, hkv, d)
    t1_tables = torch.arange(batch, dtype=torch.int32, device=dev).view(batch, 1)
    t1 = bench_ms(lambda: paged_decode(q, k1, v1, t1_tables, lens, scale, backend="triton"), dry)
    # Contiguous SDPA baseline on the same data.
    kc = k[1:].view(batch, ctx, hkv, d).transpose(1, 2).contiguous()
    vc = v[1:].view(batch, ctx, hkv, d).transpose(1, 2).contiguous()
    q_rows = q.view(batch, hkv, hq // hkv, d)
    q_gqa = q.view(batch, hq, 1, d)
    t_rows = bench_ms(lambda: F.scaled_dot_product_attention(q_rows, kc, vc, scale=scale), dry)
    try:
        t_gqa = bench_ms(
            lambda: F.scaled_dot_product_attention(q_gqa, kc, vc, scale=scale, enable_gqa=True), dry
        )
    except Exception:  # older torch, or no SDPA kernel for this form
        t_gqa = float("inf")
    t_sdpa = min(t_rows, t_gqa)
    kv_bytes = 2 * batch * ctx * hkv * d * dtype.itemsize
    gbs = kv_bytes / (t16 * 1e-3) / 1e9
    row = (
        f"| {model} | {batch} | {ctx} | {kv_bytes / 2**20:.0f} | {splits} | {t16 * 1e3:.1f} | {gbs:.0f} | "
        f"{gbs / copy_gbs * 100:.0f}% | {t1 * 1e3:.1f} | {t16 / t1:.2f} | {t_sdpa * 1e3:.1f} | "
        f"{t16 / t_sdpa:.2f} |"
    )
    return row, (gbs / copy_gbs, t16 / t1, t16 / t_sdpa, gbs)


def tile_sweep(report: Report, dev: torch.device, dry: bool, deadline: float) -> None:
    """A few decode tile configs on one large case, to guide tuning (the default is restored)."""
    if time.monotonic() > deadline:
        return
    batch, ctx, (hq, hkv, d) = (2, 64, SHAPES["Llama-3-8B"]) if dry else (64, 8192, SHAPES["Llama-3-8B"])
    report.add(f"## Decode tile sweep (Llama-3-8B heads, batch {batch} x ctx {ctx}, page 16, fp16)", "")
    report.add("| block_n | num_warps | num_stages | us | GB/s |", "| ---: | ---: | ---: | ---: | ---: |")
    page, nb = 16, ctx // 16
    n = batch * nb + 1
    k = torch.randn(n, page, hkv, d, dtype=torch.float16, device=dev)
    v = torch.randn_like(k)
    tables = (torch.randperm(n - 1, device=dev)[: batch * nb] + 1).view(batch, nb).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, dtype=torch.float16, device=dev)
    default = dict(DECODE_CONFIG)
    configs = [(64, 4, 2), (32, 4, 3), (64, 4, 3), (128, 4, 2), (128, 8, 3), (64, 2, 3)]
    if dry:
        configs = configs[:1]
    kv_bytes = 2 * batch * ctx * hkv * d * 2
    try:
        for block_n, warps, stages in configs:
            if time.monotonic() > deadline:
                break
            DECODE_CONFIG.update(block_n=block_n, num_warps=warps, num_stages=stages)
            try:
                ms = bench_ms(lambda: paged_decode(q, k, v, tables, lens, 0.1, backend="triton"), dry)
                report.add(f"| {block_n} | {warps} | {stages} | {ms * 1e3:.1f} | {kv_bytes / ms / 1e6:.0f} |")
            except Exception as exc:
                report.add(f"| {block_n} | {warps} | {stages} | raised {type(exc).__name__} | - |")
    finally:
        DECODE_CONFIG.clear()
        DECODE_CONFIG.update(default)
    report.add("")
    report.flush()


def engine(report: Report, dev: torch.device, dry: bool) -> None:
    """`engine_check`; the daemon's own dependencies missing here skip it (reported)."""
    threads = torch.get_num_threads()
    if dry:  # tiny shapes: a second thread's wake-ups cost more than its share (5x on a busy machine)
        torch.set_num_threads(1)
    try:
        engine_check(report, dev, dry)
    except ImportError as exc:
        report.add("## Engine", "", f"Not run: {exc} (install the daemon's dependencies to run it).", "")
    except Exception as exc:
        traceback.print_exc()
        report.add(f"Engine check raised {type(exc).__name__}: {exc}", "")
        report.failures.append(f"engine: {exc}")
    finally:
        torch.set_num_threads(threads)
        if dev.type == "cuda":  # the engines' pools go before the bandwidth sweep's buffers come
            gc.collect()
            torch.cuda.empty_cache()
    report.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes, wall-clock timing"
    )
    ap.add_argument("--out", type=Path, default=None, help="report folder (default: $OUT, else docs/)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new benchmarks after this")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-bandwidth", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--models", default="", help="comma-separated SHAPES names (default: all)")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--ctxs", default="1024,4096,16384,32768")
    ap.add_argument(
        "--watchdog-s",
        type=float,
        default=0.0,
        help="dump every thread's stack and exit after this (default: budget + 60 s); a call blocked "
        "in the driver never returns to Python, so a signal from outside cannot end it",
    )
    args = ap.parse_args(argv)
    start = time.monotonic()
    if not args.dry_run:  # the dry run is called in-process by the tests: no exit behind their back
        faulthandler.dump_traceback_later(args.watchdog_s or args.budget_s + 60, exit=True)
    sweep = Sweep(
        models=[m for m in args.models.split(",") if m],
        batches=[int(b) for b in args.batches.split(",")],
        ctxs=[int(c) for c in args.ctxs.split(",")],
    )
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; use --dry-run to exercise the script on CPU", file=sys.stderr)
            return 2
        dev = torch.device("cuda")
    out_dir = args.out or Path(os.environ.get("OUT") or ROOT / "docs")
    report = Report(out_dir / ("gpu-dry-run.md" if args.dry_run else "gpu.md"))
    import triton

    gpu = "CPU (Triton interpreter, dry run)"
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        gpu = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB"
    report.add(
        "# radixd kernels: GPU check",
        "",
        f"- device: {gpu}",
        f"- torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}",
        f"- command: `{' '.join(['bash bench/gpu_check.sh', *(sys.argv[1:] if argv is None else argv)])}`",
        f"- decode tiles: {DECODE_CONFIG}",
        "",
    )
    report.flush()
    if not args.skip_engine:
        _progress("engine")
        engine(report, dev, args.dry_run)
    torch.manual_seed(0)
    if not args.skip_correctness:
        _progress("correctness")
        correctness(report, dev, args.dry_run)
    if not args.skip_bandwidth:
        deadline = start + args.budget_s
        bandwidth(report, dev, args.dry_run, deadline - (0 if args.dry_run else 45), sweep)
        _progress("tile sweep")
        tile_sweep(report, dev, args.dry_run, deadline)
    if _FALLBACKS:
        report.add(f"CUDA-graph capture failed for {len(_FALLBACKS)} timings; those used plain do_bench.", "")
    report.add(f"Total wall time {time.monotonic() - start:.0f} s. Failures: {len(report.failures)}.")
    report.flush()
    faulthandler.cancel_dump_traceback_later()
    print(report.path.read_text())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
