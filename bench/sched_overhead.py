"""Scheduler overhead: the time a decode step spends outside the forward pass, per phase.

    .venv/bin/python bench/sched_overhead.py                     # 256 sequences of ~1k tokens
    .venv/bin/python bench/sched_overhead.py --seqs 64 --steps 100
    .venv/bin/python bench/sched_overhead.py --stream-interval 8    # `radixd serve --stream-interval 8`
    .venv/bin/python bench/sched_overhead.py --sink bridge          # with the daemon's handover to its loop

The engine runs as the daemon runs it (`EngineCore.step`: scheduling, KV bookkeeping, copy-on-write
copies, the runner building the step's tensors, sampling, accepting tokens and streaming text), over a
null model: its forward pass returns zeros and its logits are fixed, so what is left is everything a
GPU decode step of a small model would have to hide (about 2 ms). The workload: `--groups` shared
prefixes of `--prefix` tokens, `--seqs` requests spread over them, each with `--suffix` tokens of its
own, greedy, decoding `--steps` tokens after all are admitted and prefilled. The embedded model's real
tokenizer and vocabulary are used (detokenizing and argmax over 49,152 logits are part of the cost).

Reports the median per step of each phase, of the whole step outside the forward pass and of the
engine's own share (all but sampling), their means, the floor under sampling (one read of the step's
logits), and what publishing a filled block into the tree costs (per insert). `--steps 800 --suffix 32`
measures long generations, whose paths in the tree grow a node per block.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import uvloop
from benchkit import (
    AttentionMetadata,
    EngineConfig,
    EngineCore,
    GenerateRequest,
    Limits,
    ModelConfig,
    ModelRunner,
    OutputBridge,
    RequestOutput,
    SamplingParams,
    Sink,
    configure,
    model_files,
    runner_module,
    startup_heap_frozen,
)


class NullModel:
    """Duck-types `LlamaModel` for the runner: no compute, fixed logits (greedy picks `token`)."""

    def __init__(self, config: ModelConfig, token: int, max_rows: int, forward_s: float = 0.0) -> None:
        self.config = config
        self.forward_s = forward_s  # a device's forward pass: the host waits with the GIL released
        self.dtype = torch.float32
        # The runner's pool takes this dtype; the null forward never reads the pool (only the
        # copy-on-write copies touch it), so the reference mode's fp32 stands for every mode.
        self.kv_dtype = torch.float32
        # Materialized once: a real model writes its logits anyway, and that is forward-pass time.
        self._logits = torch.zeros(max_rows, config.vocab_size)
        self._logits[:, token] = 1.0
        self._hidden = torch.zeros(1, config.hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        if self.forward_s:
            time.sleep(self.forward_s)
        return self._hidden.expand(input_ids.shape[0], -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        # A step that verifies drafts asks for more rows than sequences (the draft budget decides).
        return self._logits[:n] if n <= len(self._logits) else self._logits[:1].expand(n, -1)


class PhaseClock:
    """Accumulates wall time per phase within one step."""

    def __init__(self) -> None:
        self.now: dict[str, float] = defaultdict(float)
        self.calls: dict[str, list[float]] = defaultdict(list)  # per call, for `each`

    def each(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Time every call of `fn` on its own (a step's part, not a phase of its own)."""
        calls = self.calls[name]

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                calls.append(time.perf_counter() - t0)

        return timed

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[name] += time.perf_counter() - t0

        return timed


def build(args: argparse.Namespace) -> tuple[EngineCore, PhaseClock]:
    files = model_files()  # the real tokenizer and vocabulary; the weights are never built
    tok = files.tokenizer
    # One layer with one tiny KV head keeps the pool small; the null forward never reads it.
    cfg = replace(files.config, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8)
    word = tok.encode(" the", add_special_tokens=False)[0]
    # Prefill runs 4,096 tokens a step, so early sequences decode a few dozen tokens before the last
    # is admitted: room for 128 tokens each beyond the measured steps.
    per_seq = (args.suffix + args.steps + 128) // 16 + 3
    blocks = args.groups * (args.prefix // 16 + 1) + args.seqs * per_seq + 64
    model = NullModel(cfg, word, args.seqs, args.forward_ms / 1000)
    runner = ModelRunner(model, blocks, 16)  # type: ignore[arg-type]
    config = EngineConfig(
        max_num_seqs=args.seqs,
        max_num_batched_tokens=max(4096, args.seqs),
        schedule_policy="lpm",
        max_waiting=args.seqs * 2,
        stream_interval=args.stream_interval,
    )
    eos = tuple(tok.eos_token_ids) or tuple(files.config.eos_token_ids)  # as build_core takes them
    core = EngineCore(runner, tok, config, eos_token_ids=eos)
    clock = PhaseClock()
    # The phases: the scheduler's plan (admission, KV bookkeeping, preemption), the runner building
    # the step's tensors, the (null) forward and logits, sampling, and accepting the sampled tokens.
    core.scheduler.schedule = clock.wrap("schedule", core.scheduler.schedule)  # type: ignore[method-assign]
    model = runner.model
    model.forward = clock.wrap("forward (null)", model.forward)  # type: ignore[method-assign]
    model.logits = clock.wrap("forward (null)", model.logits)  # type: ignore[method-assign]
    runner_module.sample = clock.wrap("sample", runner_module.sample)
    runner._forward = clock.wrap("runner: batch tensors", runner._forward)  # type: ignore[method-assign]
    core.admin.track_peaks = clock.wrap("peak tracking", core.admin.track_peaks)  # type: ignore[method-assign]
    core._after_step = clock.wrap("accept + outputs", core._after_step)  # type: ignore[method-assign]
    # Within accepting: each block a sequence fills is published into the tree (one insert).
    cache = core.kv.cache
    cache.insert_table = clock.each("publish", cache.insert_table)  # type: ignore[method-assign]
    return core, clock


def requests(args: argparse.Namespace, vocab: int) -> list[GenerateRequest]:
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(100, vocab, (args.prefix,), generator=g).tolist() for _ in range(args.groups)]
    out = []
    for i in range(args.seqs):
        own = torch.randint(100, vocab, (args.suffix,), generator=g).tolist()
        params = SamplingParams(max_tokens=args.steps + 128, temperature=0.0, ignore_eos=True)
        out.append(GenerateRequest(f"r{i}", prefixes[i % args.groups] + own, params))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--groups", type=int, default=16, help="distinct shared prefixes")
    ap.add_argument("--prefix", type=int, default=768, help="tokens of each shared prefix")
    ap.add_argument("--suffix", type=int, default=256, help="tokens of each request's own")
    ap.add_argument("--steps", type=int, default=60, help="decode steps measured")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--stream-interval",
        type=int,
        default=EngineConfig().stream_interval,
        help="tokens per streamed output",
    )
    ap.add_argument(
        "--sink",
        choices=("count", "bridge"),
        default="count",
        help="count: a sink that counts tokens; bridge: the daemon's handover, each output through an "
        "OutputBridge onto a uvloop loop in its own thread, drained there as the gRPC handler reads",
    )
    ap.add_argument(
        "--forward-ms",
        type=float,
        default=0.0,
        help="the null forward pass waits this long with the GIL released, as a host waits on a device "
        "(what other threads, such as the loop reading outputs, can use); not counted in the figures",
    )
    ap.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the startup heap to the garbage collector (the daemon before it froze it; to compare)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configure("warning")
    core, clock = build(args)
    sinks = LoopSinks(Limits.stream_buffer) if args.sink == "bridge" else CountSinks()
    try:
        if args.no_freeze:
            measure(args, core, clock, sinks)
            return
        with startup_heap_frozen():  # as `radixd serve` serves, once it has loaded
            measure(args, core, clock, sinks)
    finally:
        sinks.close()


class CountSinks:
    """Sinks that count the tokens they are given, on the engine thread."""

    def __init__(self) -> None:
        self.tokens = 0

    def new(self) -> Sink:
        def sink(out: RequestOutput) -> None:
            self.tokens += len(out.new_token_ids)

        return sink

    def close(self) -> None:
        return


class LoopSinks:
    """The daemon's handover (`radixd.daemon.server.common.bridge.OutputBridge`): the engine thread hands each
    output to a uvloop loop running in its own thread, where one task per stream reads it as the gRPC
    handler does (without the protobuf and the socket)."""

    def __init__(self, buffer: int) -> None:
        self.tokens = 0
        self.overflows = 0
        self.buffer = buffer
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="loop", daemon=True)
        self.thread.start()
        self.readers: list[concurrent.futures.Future[None]] = []

    def new(self) -> Sink:
        bridge = OutputBridge(self.loop, self.buffer, self._overflow)
        self.readers.append(asyncio.run_coroutine_threadsafe(self._read(bridge), self.loop))
        return bridge.sink

    def _overflow(self) -> None:
        self.overflows += 1

    async def _read(self, bridge: OutputBridge) -> None:
        while True:
            out = await bridge.get()
            self.tokens += len(out.new_token_ids)
            if out.finished:
                return

    def close(self) -> None:
        for reader in self.readers:
            reader.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
        if self.overflows:
            raise SystemExit(f"{self.overflows} streams overflowed: the loop fell behind the engine")


def measure(
    args: argparse.Namespace, core: EngineCore, clock: PhaseClock, sinks: CountSinks | LoopSinks
) -> None:
    """Admit and prefill every request, then time `--steps` steps in which all of them decode."""
    for req in requests(args, core.vocab_size):
        core.requests.add(req, sinks.new())
    # Admit and prefill everything; measure only steps where all sequences decode.
    for _ in range(10_000):
        running = core.scheduler.running
        if (
            len(running) == args.seqs
            and all(s.remaining == 1 for s in running)
            and not core.scheduler.waiting
        ):
            break
        core.step()
    else:
        raise SystemExit("the sequences never all reached decode")
    full_gcs: list[float] = []  # full (generation 2) collections during the measured steps, in s
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                full_gcs.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    publish = clock.calls["publish"]
    publish.clear()
    totals: list[float] = []
    host: list[float] = []  # the step less the forward pass and sampling: what the engine's CPU adds
    phases: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.steps):
        clock.now.clear()
        t0 = time.perf_counter()
        assert core.step()
        total = time.perf_counter() - t0
        forward = clock.now["forward (null)"]
        totals.append(total - forward)
        host.append(total - forward - clock.now["sample"])
        # The runner's _forward wraps the null forward: count only its own work.
        clock.now["runner: batch tensors"] -= clock.now["forward (null)"]
        inner = sum(v for k, v in clock.now.items() if k != "forward (null)")
        for name, v in clock.now.items():
            phases[name].append(v)
        phases["rest: step plan to runner input, logits rows"].append(total - inner - forward)
    med = statistics.median(totals) * 1000
    print(f"{args.seqs} decoding sequences of ~{args.prefix + args.suffix} tokens ({args.groups} shared")
    print(
        f"prefixes), {args.steps} steps, {args.threads} threads, stream interval {args.stream_interval}; "
        "ms per step, median"
    )
    print("| phase | ms |\n| --- | ---: |")
    for name, vs in phases.items():
        print(f"| {name} | {statistics.median(vs) * 1000:.2f} |")
    print(f"| **outside the forward pass** | **{med:.2f}** |")
    # On a GPU the sampler runs on the device beside the forward pass; on a CPU it reads every logit
    # (bandwidth-bound), so the engine's own share is reported apart as well.
    print(f"| of it, all but sampling (the engine's own work) | {statistics.median(host) * 1000:.2f} |")
    # NOTE: sequences of equal prompt length decode in step, so every one of them fills a block in the
    # same step, one step in block_size: the median step inserts nothing, and the mean counts that step.
    print(
        f"| mean per step: outside the forward pass / the engine's own work | "
        f"{statistics.fmean(totals) * 1000:.2f} / {statistics.fmean(host) * 1000:.2f} |"
    )
    # The floor under sampling on this machine: one pass over the same logits, nothing else.
    logits = core.runner.model.logits(torch.zeros(args.seqs, 1))
    reads = []
    for _ in range(20):
        t0 = time.perf_counter()
        logits.amax(dim=1)
        reads.append(time.perf_counter() - t0)
    floor = statistics.median(reads) * 1000
    print(f"| reading the step's logits once (amax: the floor under sampling) | {floor:.2f} |")
    gc.callbacks.remove(on_gc)
    q = sorted(totals)
    print(
        f"p10 {q[len(q) // 10] * 1000:.2f} ms, p90 {q[len(q) * 9 // 10] * 1000:.2f} ms, "
        f"longest {q[-1] * 1000:.2f} ms; tokens {sinks.tokens} (sink: {args.sink})"
    )
    if publish:
        each = sorted(publish)
        print(
            f"blocks published into the tree: {len(each) / args.steps:.1f} per step, "
            f"{statistics.median(each) * 1e6:.1f} us each (median; p90 {each[len(each) * 9 // 10] * 1e6:.1f})"
        )
    pauses = ", ".join(f"{t * 1000:.1f}" for t in full_gcs) or "none"
    print(f"full garbage collections during the measured steps: {len(full_gcs)} (ms: {pauses})")


if __name__ == "__main__":
    main()
