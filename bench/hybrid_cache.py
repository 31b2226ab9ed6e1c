"""A multi-turn agent trace on a model with sliding-window layers (Gemma 3): radixd's KV layouts side by
side at the same pool size in bytes, beside llama-server with and without `--swa-full`.

    python bench/hybrid_cache.py --model DIR/gemma-3-270m-q4_k_m.gguf --llama-bin DIR/llama/build/bin \\
        --out docs/measurements/bench-hybrid-cache.md
    python bench/hybrid_cache.py --quick          # a tiny random Gemma 3, 2 x 2 turns, one pool
    python bench/hybrid_cache.py --model FILE --llama-bin DIR --no-radixd   # llama-server alone

The trace (seeded): `--conversations` conversations of `--turns` turns sharing a `--system-tokens`
system prompt; turn 1 is a user task, the others tool outputs, each `--turn-tokens` long; each turn's
prompt is the whole history in Gemma's turn format (the conversation's earlier outputs included) and
asks for `--max-tokens` greedy tokens. Conversations are interleaved: turn t of every conversation, one
request at a time, before turn t + 1. Prompts are token ids (seeded text through the model's tokenizer,
as the daemon encodes a text prompt), so every peer sees the same tokens. Without `--model` the model
is a random-weight Gemma 3 of the 270M shape (SmolLM2's tokenizer), written with gguf-py.

radixd runs as `radixd serve` over gRPC, once per KV layout (`--kv-layout`), at a tight pool (the shared
prompt plus `--warm-convs` conversations' own tokens at the full layout) and at a roomy one (every
conversation fits either way). Per run: time to first token of turns 2+ (client side), output tokens
over the trace's wall time, decode tokens/s, prefix tokens reused (the requests' cached_tokens),
conversations kept warm (after each round, LookupPrefix on each conversation's history: warm when it
finds >= 95% of it; the mean over rounds 2+) and KV bytes held per cached token (GetCacheStats at the
end), with the theoretical bound of the windowed layout beside it. llama-server (`-np 1`, its defaults:
prompt cache in RAM, context checkpoints) gets the same requests on `/completion`; its prefix reuse is
its `timings.cache_n`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import gguf
import numpy as np
from benchkit import (
    Daemon,
    copy_tokenizer,
    cpu_flags,
    default_dtype_name,
    default_model_path,
    gguf_file_module,
    resolve_precision,
    write_report,
)
from llama_server import LlamaServer, require_binary
from radixd_client import Chunk, Client, Start

# NOTE: the one place that names the daemon's layout flag and its values.
KV_LAYOUT_FLAG = "--kv-layout"
LAYOUTS = ("full", "windowed")
# The windowed layout's second design (--shared-windows): windows kept at shared prefixes only.
SHARED = ("windowed shared", (KV_LAYOUT_FLAG, "windowed", "--kv-windows", "shared"))
WARM_SHARE = 0.95  # a conversation is warm when LookupPrefix finds this share of its history
ISA = ("avx", "amx", "fma", "f16c")  # the CPU flags the report names

# Gemma's turn format, as text the tokenizer reads (special tokens included).
OPEN = "<start_of_turn>user\n"
CLOSE = "<end_of_turn>\n<start_of_turn>model\n"
NEXT = "<end_of_turn>\n<start_of_turn>user\n"
PROSE = (
    "the build cache test runner fails when a worker restarts before its lease expires so the scheduler"
    " retries each job with backoff and records why in the log; review the change, the config and the"
    " metrics, then write a short plan with owners, risks and a rollback step for every service"
)


# ---- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A Gemma 3 model's shape (the 270M one by default)."""

    hidden: int = 640
    layers: int = 18
    heads: int = 4
    head_dim: int = 256
    intermediate: int = 2048
    window: int = 512
    pattern: int = 6  # every 6th layer global


TINY = Shape(hidden=64, layers=6, heads=2, head_dim=32, intermediate=128, window=32)


def _tensors(s: Shape, vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor; a 1-D one is a norm. Tied embeddings: no output.weight."""
    yield "token_embd.weight", (vocab, s.hidden)
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_q.weight", (s.heads * s.head_dim, s.hidden)
        yield b + "attn_k.weight", (s.head_dim, s.hidden)
        yield b + "attn_v.weight", (s.head_dim, s.hidden)
        yield b + "attn_output.weight", (s.hidden, s.heads * s.head_dim)
        yield b + "ffn_gate.weight", (s.intermediate, s.hidden)
        yield b + "ffn_up.weight", (s.intermediate, s.hidden)
        yield b + "ffn_down.weight", (s.hidden, s.intermediate)
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            yield b + norm + ".weight", (s.hidden,)
        for norm in ("attn_q_norm", "attn_k_norm"):
            yield b + norm + ".weight", (s.head_dim,)
    yield "output_norm.weight", (s.hidden,)


def write_random_gemma(path: Path, s: Shape) -> None:
    """A random-weight Gemma 3 GGUF (one KV head, matrices in Q4_0, norms F32 ones as GGUF stores 1 + w)
    with the embedded SmolLM2's tokenizer, written tensor by tensor."""
    w = gguf.GGUFWriter(str(path) + ".part", "gemma3")
    w.add_name(f"random gemma3 {s.hidden}x{s.layers}")
    w.add_context_length(32768)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.intermediate)
    w.add_head_count(s.heads)
    w.add_head_count_kv(1)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(s.window)
    w.add_sliding_window_pattern(s.pattern)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    vocab = copy_tokenizer(w, default_model_path())
    q4 = gguf.GGMLQuantizationType.Q4_0
    for name, shape in _tensors(s, vocab):
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            bshape = gguf.quant_shape_to_byte_shape(shape, q4)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), bshape[0] * bshape[1], raw_dtype=q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _name, shape in _tensors(s, vocab):
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, np.float32))
            continue
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5 / shape[1] ** 0.5)
        w.write_tensor_data(gguf.quants.quantize(x, q4))
    w.close()
    os.replace(str(path) + ".part", path)


@dataclass(frozen=True)
class KVShape:
    """What the layouts' arithmetic needs: layers, global (full-attention) layers, window, per-token KV
    bytes at the full layout."""

    layers: int
    global_layers: int
    window: int
    token_bytes: int

    @staticmethod
    def of(path: str) -> KVShape:
        gguf_file = gguf_file_module
        cfg = gguf_file._config(gguf_file._open(path), path, 1)  # the vocabulary is not needed
        windows = cfg.layer_windows or (0,) * cfg.num_layers
        # the KV dtype of the daemon's default mode on a quantized GGUF (f16 for w4a8)
        kv = resolve_precision(default_dtype_name(), "cpu", lambda: True).kv_dtype.itemsize
        token_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * kv
        return KVShape(cfg.num_layers, windows.count(0), max(windows), token_bytes)

    def bound(self, cached: int, windows: int) -> float:
        """Windowed over full bytes per cached token when `cached` tokens sit in the global layers and
        `windows` windows of `window` tokens in the sliding ones: (G T + S min(k W, T)) / (L T)."""
        sliding = self.layers - self.global_layers
        return (self.global_layers * cached + sliding * min(windows * self.window, cached)) / (
            self.layers * cached
        )


# ---- the trace ------------------------------------------------------------------------------------


@dataclass
class Trace:
    """`head`: every conversation's first tokens (BOS, the turn opening, the system prompt);
    `segments[c][t]`: what turn t of conversation c adds before the model answers."""

    head: list[int]
    segments: list[list[list[int]]]

    def own_tokens(self, max_tokens: int) -> int:
        """The largest conversation's tokens past the shared head once every turn is answered."""
        return max(sum(len(s) + max_tokens for s in conv) for conv in self.segments)


def _text(rng: random.Random, words: int, tool: bool) -> str:
    """Seeded prose (a user's task) or, for a tool's output, JSON lines of about 8 tokens each."""
    vocab = PROSE.split()
    if not tool:
        return " ".join(rng.choice(vocab) for _ in range(words))
    lines = []
    while len(lines) * 8 < words:
        where = {"file": f"src/{rng.choice(vocab)}_{rng.randrange(100)}.py", "line": rng.randrange(999)}
        lines.append(json.dumps(where | {"status": rng.choice(("ok", "failed")), "note": rng.choice(vocab)}))
    return "\n".join(lines)


def build_trace(tok: Any, a: argparse.Namespace) -> Trace:
    """Seeded text, encoded as the daemon encodes a text prompt (`tok`: the model's tokenizer) and cut
    to the drawn lengths; the ids are what every peer is sent."""
    rng = random.Random(a.seed)

    def ids(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    def cut(text: str, n: int) -> list[int]:
        out = ids(text)
        while len(out) < n:
            out += out
        return out[:n]

    head = list(tok.encode(OPEN)) + cut(_text(rng, a.system_tokens, False), a.system_tokens)
    close, nxt, sep = ids(CLOSE), ids(NEXT), ids("\n\n")
    lo, hi = a.turn_tokens
    segments = []
    for _ in range(a.conversations):
        conv = []
        for t in range(a.turns):
            n = rng.randint(lo, hi)
            conv.append((nxt if t else sep) + cut(_text(rng, n, tool=t > 0), n) + close)
        segments.append(conv)
    return Trace(head, segments)


# ---- the peers ------------------------------------------------------------------------------------


@dataclass
class Reply:
    prompt: int
    cached: int
    out: list[int]
    ttft_s: float
    decode_s: float


class Peer(Protocol):
    def generate(self, ids: list[int], max_tokens: int) -> Reply: ...

    def warm(self, histories: Sequence[list[int]]) -> int | None: ...

    def stats(self) -> Any: ...


class Radixd:
    """`radixd serve` with `extra` flags, through the public and admin gRPC ports."""

    def __init__(self, model: str, extra: Sequence[str]) -> None:
        token = secrets.token_hex(16)
        self.daemon = Daemon(["--model", model, "--admin-token", token, *extra])
        self.client = Client(self.daemon.address, admin_address=self.daemon.admin_address, admin_token=token)

    def generate(self, ids: list[int], max_tokens: int) -> Reply:
        t0 = time.perf_counter()
        first = last = 0.0
        cached = 0
        out: list[int] = []
        stream = self.client.generate(
            ids, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, timeout=600
        )
        for ev in stream:
            if isinstance(ev, Start):
                cached = ev.cached_tokens
            elif isinstance(ev, Chunk) and ev.token_ids:
                last = time.perf_counter()
                first = first or last
                out += ev.token_ids
        return Reply(len(ids), cached, out, first - t0, last - first)

    def warm(self, histories: Sequence[list[int]]) -> int:
        found = [self.client.lookup_prefix(h).cached_tokens for h in histories]
        return sum(f >= WARM_SHARE * len(h) for f, h in zip(found, histories, strict=True))

    def stats(self) -> Any:
        return self.client.cache_stats()

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()


class Llama:
    """llama-server on `/completion` with token ids, streamed (its first token is the first chunk)."""

    def __init__(self, binary: str, model: str, threads: int, context: int, extra: Sequence[str]) -> None:
        self.server = LlamaServer(binary, threads, context=context, extra=extra, model=model)
        self.url = self.server.ready()

    def generate(self, ids: list[int], max_tokens: int) -> Reply:
        body = {"prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "ignore_eos": True,
                "cache_prompt": True, "stream": True, "return_tokens": True}  # fmt: skip
        req = urllib.request.Request(
            self.url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        t0 = time.perf_counter()
        first = last = 0.0
        out: list[int] = []
        cached = 0
        with urllib.request.urlopen(req, timeout=600) as resp:
            for line in resp:
                if not line.startswith(b"data: "):
                    continue
                msg = json.loads(line[6:])
                if msg.get("tokens"):
                    last = time.perf_counter()
                    first = first or last
                    out += msg["tokens"]
                if msg.get("stop"):
                    cached = int(msg.get("timings", {}).get("cache_n", 0))
        return Reply(len(ids), cached, out, first - t0, last - first)

    def warm(self, histories: Sequence[list[int]]) -> None:
        return None

    def stats(self) -> None:
        return None

    def close(self) -> None:
        self.server.close()


# ---- a run ----------------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    replies: list[list[Reply]] = field(default_factory=list)  # [round][conversation]
    wall_s: float = 0.0
    warm: list[int] = field(default_factory=list)  # after each round (radixd)
    stats: Any = None  # GetCacheStats after the last round (radixd)
    histories: list[list[int]] = field(default_factory=list)

    def later(self) -> list[Reply]:
        return [r for rnd in self.replies[1:] for r in rnd]

    def ttft_ms(self, how: Callable[[list[float]], float]) -> float:
        return how([r.ttft_s for r in self.later()]) * 1000

    def out_tokens(self) -> int:
        return sum(len(r.out) for rnd in self.replies for r in rnd)

    def decode_tps(self) -> float:
        replies = [r for rnd in self.replies for r in rnd]
        return sum(len(r.out) - 1 for r in replies) / max(sum(r.decode_s for r in replies), 1e-9)

    def reused(self) -> int:
        return sum(r.cached for rnd in self.replies for r in rnd)

    def mean_warm(self) -> float:
        return statistics.mean(self.warm[1:]) if len(self.warm) > 1 else math.nan

    def bytes_per_token(self) -> float:
        return bytes_per_cached_token(self.stats) if self.stats is not None else math.nan


def bytes_per_cached_token(stats: Any) -> float:
    """KV bytes held per cached token, from GetCacheStats: (tree_blocks + window_pages) x
    kv_bytes_per_block / (tree_blocks x block_size)."""
    tree = stats.tree_blocks
    held = (tree + stats.window_pages) * stats.kv_bytes_per_block
    return float(held / (tree * stats.block_size)) if tree else math.nan


def run_trace(label: str, peer: Peer, trace: Trace, max_tokens: int) -> Run:
    """The trace on `peer`, rounds interleaved; the warm count and stats read between rounds."""
    # warm-up (kernels, allocations): the trace's last segment reversed, sharing no prefix with it
    peer.generate(trace.segments[-1][-1][::-1], 2)
    run = Run(label)
    histories = [list(trace.head) for _ in trace.segments]
    for t in range(len(trace.segments[0])):
        t0 = time.perf_counter()
        replies = []
        for c, conv in enumerate(trace.segments):
            prompt = histories[c] + conv[t]
            reply = peer.generate(prompt, max_tokens)
            histories[c] = prompt + reply.out
            replies.append(reply)
        run.wall_s += time.perf_counter() - t0
        run.replies.append(replies)
        warm = peer.warm(histories)
        if warm is not None:
            run.warm.append(warm)
        print(f"{label}: round {t + 1} in {time.perf_counter() - t0:.1f} s, warm {warm}", file=sys.stderr)
    run.stats = peer.stats()
    run.histories = histories
    return run


def radixd_run(
    model: str, trace: Trace, a: argparse.Namespace, name: str, flags: tuple[str, ...], pool: str, gib: float
) -> Run:
    """`radixd serve` with the KV `flags` of design `name`, at a pool of `gib`, through the trace."""
    peer = Radixd(model, ["--kv-cache-gb", f"{gib:.6f}", *flags])
    try:
        run = run_trace(f"radixd {name}, {pool} pool", peer, trace, a.max_tokens)
    finally:
        peer.close()
    return run


def llama_run(model: str, trace: Trace, a: argparse.Namespace, swa_full: bool) -> Run:
    binary = require_binary(str(Path(a.llama_bin) / "llama-server"))
    context = len(trace.head) + trace.own_tokens(a.max_tokens) + 64
    peer = Llama(binary, model, a.threads, context, ["--swa-full"] if swa_full else [])
    try:
        return run_trace(f"llama-server{' --swa-full' if swa_full else ''}", peer, trace, a.max_tokens)
    finally:
        peer.close()


# ---- the report -----------------------------------------------------------------------------------


def table(runs: list[Run]) -> list[str]:
    out = [
        "| system | TTFT turns 2+ mean ms | median ms | output tok/s | decode tok/s | prefix tokens reused"
        " | prompt tokens | conversations warm | KV bytes / cached token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        prompt = sum(x.prompt for rnd in r.replies for x in rnd)
        warm = f"{r.mean_warm():.2f}" if r.warm else "-"
        per = f"{r.bytes_per_token():,.0f}" if r.stats is not None else "-"
        out.append(
            f"| {r.label} | {r.ttft_ms(statistics.mean):.0f} | {r.ttft_ms(statistics.median):.0f}"
            f" | {r.out_tokens() / r.wall_s:.1f} | {r.decode_tps():.1f} | {r.reused():,} | {prompt:,}"
            f" | {warm} | {per} |"
        )
    return out


def cache_lines(runs: list[Run]) -> list[str]:
    """What GetCacheStats said at the end of each radixd run, and the warm counts after each round."""
    names = ("kv_layout", "tree_blocks", "window_pages", "kept_windows", "window_tombstones",
             "kv_bytes_per_block", "total_blocks", "evictable_blocks")  # fmt: skip
    out = []
    for r in runs:
        if r.stats is not None:
            stats = ", ".join(f"{n} {getattr(r.stats, n)}" for n in names)
            out.append(f"- {r.label}: {stats}; warm after each round {' '.join(map(str, r.warm))}")
    return out


def _target(name: str, value: float, goal: float, at_most: bool) -> str:
    if math.isnan(value):
        return f"- {name}: n/a"
    met = value <= goal if at_most else value >= goal
    return f"- {name}: {value:.2f}x ({'<=' if at_most else '>='} {goal:.3g}x: {'met' if met else 'missed'})"


def targets(runs: dict[str, Run]) -> list[str]:
    """Windowed against full (tight pool unless said), and against llama-server."""
    full, win = runs.get("full tight"), runs.get("windowed tight")
    if full is None or win is None:
        return ["- targets: need both layouts (radixd was not run)"]
    out = [
        _target("KV bytes per cached token, windowed / full", win.bytes_per_token() / full.bytes_per_token(),
                0.35, True),
        _target("conversations kept warm, windowed / full", win.mean_warm() / max(full.mean_warm(), 1e-9),
                2.5, False),
    ]  # fmt: skip
    if "full roomy" in runs and "windowed roomy" in runs:
        ratio = runs["windowed roomy"].reused() / max(runs["full roomy"].reused(), 1)
        out.append(_target("prefix tokens reused when both fit, windowed / full", ratio, 0.95, False))
    for key in ("llama", "llama swa-full"):
        if key in runs:
            ratio = win.ttft_ms(statistics.mean) / runs[key].ttft_ms(statistics.mean)
            out.append(_target(f"mean TTFT of turns 2+, windowed / {runs[key].label}", ratio, 1 / 3, True))
    tps = (win.out_tokens() / win.wall_s) / (full.out_tokens() / full.wall_s)
    out.append(_target("output tokens/s, windowed / full", tps, 1.0, False))
    shared = runs.get("shared tight")
    if shared is not None:  # the second design against the same targets
        out.append(_target("KV bytes per cached token, shared windows / full",
                           shared.bytes_per_token() / full.bytes_per_token(), 0.35, True))  # fmt: skip
        for key in ("llama", "llama swa-full"):
            if key in runs:
                ratio = shared.ttft_ms(statistics.mean) / runs[key].ttft_ms(statistics.mean)
                out.append(
                    _target(f"mean TTFT of turns 2+, shared windows / {runs[key].label}", ratio, 1 / 3, True)
                )
        ratio = shared.ttft_ms(statistics.mean) / win.ttft_ms(statistics.mean)
        out.append(f"- mean TTFT of turns 2+, shared windows / windowed: {ratio:.2f}x")
    return out


def bound_lines(shape: KVShape, trace: Trace, runs: dict[str, Run]) -> list[str]:
    """The windowed layout's bound at the trace's end: every conversation's tokens cached once, a window
    kept at each conversation's last turn and at the branch point (the shared prompt's end)."""
    any_run = next(iter(runs.values()))
    head = len(trace.head)
    cached = head + sum(len(h) - head for h in any_run.histories)
    k = len(trace.segments) + 1
    g, s, n, w = shape.global_layers, shape.layers - shape.global_layers, shape.layers, shape.window
    longest = max(len(h) for h in any_run.histories)
    return [
        f"- bound, windowed / full bytes per cached token: ({g} T + {s} k W) / ({n} T) with W = {w}"
        f" (the window), T = {cached:,} (tokens cached at the end: the shared prompt once, each"
        f" conversation's own tokens), k = {k} (a window per conversation and the branch point)"
        f" = {shape.bound(cached, k):.3f}",
        f"- one conversation of L tokens: {g}/{n} + {s}/{n} x W / L -> {g}/{n} = {g / n:.3f} as L grows;"
        f" at L = {longest:,} (this trace's longest) {shape.bound(longest, 1):.3f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Gemma 3 GGUF (default: a random-weight one of the 270M shape)")
    ap.add_argument("--dir", type=Path, help="where the random model is written (default: a temporary dir)")
    ap.add_argument("--llama-bin", help="llama.cpp's bin directory (llama-server); omitted: radixd alone")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's threads")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--turn-tokens", type=int, nargs=2, default=(200, 400), metavar=("MIN", "MAX"))
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--warm-convs", type=float, default=4, help="tight pool: conversations, full layout")
    ap.add_argument("--roomy-convs", type=float, default=12, help="roomy pool: the same; 0 skips it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-radixd", action="store_true", help="llama-server alone (with --llama-bin)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny random model, 2 x 2 turns, the tight pool only, no llama-server",
    )
    ap.add_argument(
        "--shared-windows",
        action="store_true",
        help="also run the windowed layout keeping windows at shared prefixes only (`--kv-windows shared`)",
    )
    ap.add_argument("--out", help="also write the report (markdown) here")
    a = ap.parse_args()
    if a.quick:
        a.conversations, a.turns, a.system_tokens, a.turn_tokens, a.max_tokens = 2, 2, 48, (16, 32), 4
        a.warm_convs, a.roomy_convs, a.llama_bin, a.model = 2, 0, None, None  # one pool: two daemons
    with tempfile.TemporaryDirectory(prefix="radixd-hybrid-") as tmp:
        model = a.model
        if model is None:
            shape = TINY if a.quick else Shape()
            where = a.dir or Path(tmp)
            where.mkdir(parents=True, exist_ok=True)
            path = where / f"gemma3-random-h{shape.hidden}-l{shape.layers}-q4_0.gguf"
            if not path.exists():
                write_random_gemma(path, shape)
            model = str(path)
        measure(model, a)


def measure(model: str, a: argparse.Namespace) -> None:
    shape = KVShape.of(model)
    gguf_file = gguf_file_module
    trace = build_trace(gguf_file._tokenizer(gguf_file._open(model), model), a)
    own = trace.own_tokens(a.max_tokens)
    if len(trace.head) + a.warm_convs * own < len(trace.head) + own:
        raise SystemExit(f"--warm-convs {a.warm_convs:g}: the tight pool must hold one whole conversation")
    pools = {"tight": a.warm_convs} | ({"roomy": a.roomy_convs} if a.roomy_convs else {})
    runs: dict[str, Run] = {}
    if a.no_radixd:
        pools = {}
    for pool, convs in pools.items():
        gib = (len(trace.head) + convs * own) * shape.token_bytes / 2**30
        for layout in LAYOUTS:
            runs[f"{layout} {pool}"] = radixd_run(
                model, trace, a, layout, (KV_LAYOUT_FLAG, layout), pool, gib
            )
        if a.shared_windows:
            runs[f"shared {pool}"] = radixd_run(model, trace, a, *SHARED, pool, gib)
    if a.llama_bin:
        runs["llama"] = llama_run(model, trace, a, swa_full=False)
        runs["llama swa-full"] = llama_run(model, trace, a, swa_full=True)
    cmd = "$ python bench/hybrid_cache.py " + " ".join(sys.argv[1:])
    tight_gib = (len(trace.head) + a.warm_convs * own) * shape.token_bytes / 2**30
    lines = [
        cmd,
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, flags: {' '.join(sorted(f for f in cpu_flags() if f.startswith(ISA)))}",
        f"model: {Path(model).name}: {shape.layers} layers, {shape.global_layers} global, window"
        f" {shape.window}, {shape.token_bytes:,} KV bytes per token at the full layout",
        f"trace: {a.conversations} conversations x {a.turns} turns, shared prompt {len(trace.head):,} tokens,"
        f" turns {a.turn_tokens[0]}-{a.turn_tokens[1]} tokens, {a.max_tokens} greedy tokens a turn;"
        f" the longest conversation {len(trace.head) + own:,} tokens",
        f"pools: tight {tight_gib:.4f} GiB (the shared prompt + {a.warm_convs:g} conversations at the full"
        f" layout)" + (f", roomy {a.roomy_convs:g} conversations" if a.roomy_convs else ""),
        "",
        *table(list(runs.values())),
        "",
        "GetCacheStats after the last round:",
        "",
        *cache_lines(list(runs.values())),
        "",
        *targets(runs),
        *bound_lines(shape, trace, runs),
    ]
    write_report(lines, a.out)


if __name__ == "__main__":
    main()
