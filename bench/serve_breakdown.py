"""Where a served batch-1 decode step goes: the engine thread's phases, served and offline, and the
CPU the serving threads spend per token.

One process holds the engine; the daemon (`radixd.daemon.server.app.start`, the gRPC servers on a
uvloop loop in their own thread, exactly as `radixd serve` runs them but in this process so the engine
thread can be timed) serves it on 127.0.0.1, and a client in a separate process (this script with
`--client`) streams one greedy `Generate`. "Offline" is the same engine in the same process, its
request submitted directly with a sink that only counts: no server, no loop, no gRPC.

Per decode step of the engine thread (wall time, perf_counter_ns wrappers around the components'
methods): scheduling, the forward pass (batch tensors and model), lm_head, sampling, accepting the
token (detokenizing, building the output, the sink, which in the daemon is the handover to the loop),
and the rest of the loop (the command queue, timers). Per token: the CPU time of the event loop's
thread, of gRPC's poller thread and of the engine thread (`pthread_getcpuclockid`).

    PYTHONPATH=$PWD:$PWD/clients .venv/bin/python -P bench/serve_breakdown.py --context 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import uvloop

import radixd.daemon.executor.runner as runner_mod
from radixd.daemon.engine.textstream import TextStream
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.process.log import configure
from radixd.daemon.server import main as server_main
from radixd.daemon.server.app import load, start

PHASES = ("schedule", "forward", "lm_head", "sample", "accept", "emit", "detok")


def prompt_ids(n: int, salt: int) -> list[int]:
    return [1000 + (i * 7919 + salt * 104729) % 30000 for i in range(n)]


class Clock:
    """Phase times of the engine thread's decode steps (a step with no prefill chunk)."""

    def __init__(self) -> None:
        self.cur: dict[str, int] = defaultdict(int)
        self.steps: list[dict[str, int]] = []
        self.on = False
        self.decode = True

    def wrap(self, obj: Any, name: str, phase: str) -> None:
        inner = getattr(obj, name)
        cur = self.cur

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return inner(*a, **k)
            finally:
                cur[phase] += time.perf_counter_ns() - t0

        setattr(obj, name, timed)

    def wrap_step(self, core: Any) -> None:
        inner = core.step
        clock = self

        def step() -> bool:
            clock.cur.clear()
            t0 = time.perf_counter_ns()
            ran = inner()
            total = time.perf_counter_ns() - t0
            if clock.on and ran and clock.decode:
                clock.steps.append({**clock.cur, "step": total, "t_end": time.perf_counter_ns()})
            return ran

        core.step = step
        inner_run = core.runner.run

        def run(chunks: Any, rows: Any) -> Any:
            clock.decode = not chunks
            return inner_run(chunks, rows)

        core.runner.run = run


def thread_cpu_s(t: threading.Thread) -> float:
    assert t.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(t.ident))


def client_main(address: str, context: int, max_tokens: int, salt: int) -> None:
    from radixd_client import AsyncClient
    from radixd_client.types import Chunk

    async def go() -> None:
        stamps: list[float] = []
        async with AsyncClient(address) as c:
            stream = c.generate(
                prompt_ids(context, salt), max_tokens=max_tokens, temperature=0.0, ignore_eos=True
            )
            async for e in stream:
                if isinstance(e, Chunk) and e.token_ids:
                    stamps.append(time.perf_counter())
        print(f"{(len(stamps) - 1) / (stamps[-1] - stamps[0]):.3f}")

    asyncio.run(go())


def summarize(label: str, clock: Clock, cpu: dict[str, float], tokens: int, tok_s: float) -> dict[str, float]:
    steps = clock.steps[2:]  # the first decode steps after a prefill pay for the prefill's allocations
    med = {p: statistics.median(s.get(p, 0) for s in steps) / 1e6 for p in (*PHASES, "step")}
    gaps = [(b["t_end"] - a["t_end"]) / 1e6 for a, b in itertools.pairwise(steps)]
    med["between steps"] = statistics.median(gaps) - med["step"] if gaps else 0.0
    med["gap"] = statistics.median(gaps) if gaps else 0.0
    med["tok/s"] = tok_s
    for name, s in cpu.items():
        med[f"cpu {name}"] = 1000 * s / tokens
    return med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", nargs=4, metavar=("ADDRESS", "CONTEXT", "MAX_TOKENS", "SALT"))
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve-args", default="")
    args = p.parse_args()
    if args.client:
        a, c, n, s = args.client
        client_main(a, int(c), int(n), int(s))
        return
    configure("warning", "console")
    parser = argparse.ArgumentParser()
    server_main.add_arguments(parser)
    sargs = parser.parse_args(["--port", "0", *args.serve_args.split()])
    built = load(sargs)
    core = built.core
    clock = Clock()
    clock.wrap_step(core)
    clock.wrap(core.scheduler, "schedule", "schedule")
    clock.wrap(core.runner, "_forward", "forward")
    clock.wrap(core.runner.model, "logits", "lm_head")
    clock.wrap(runner_mod, "sample", "sample")
    clock.wrap(core, "_after_step", "accept")
    clock.wrap(core.outputs, "emit", "emit")
    clock.wrap(TextStream, "push", "detok")
    loop = uvloop.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, name="daemon-loop", daemon=True)
    loop_thread.start()
    daemon = asyncio.run_coroutine_threadsafe(start(sargs, built), loop).result(120)
    address = f"127.0.0.1:{daemon.port}"
    engine_thread = next(t for t in threading.enumerate() if t.name == "radixd-engine")
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    salt = 0

    def threads() -> dict[str, threading.Thread]:
        out = {"loop": loop_thread, "engine": engine_thread}
        for t in threading.enumerate():
            if "_poll_wrapper" in t.name:
                out["grpc poller"] = t
        return out

    def served(n: int) -> tuple[float, dict[str, float], int]:
        nonlocal salt
        salt += 1
        cmd = [sys.executable, "-P", __file__, "--client", address, str(args.context), str(n), str(salt)]
        ths = threads()
        before = {k: thread_cpu_s(t) for k, t in ths.items()}
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        cpu = {k: thread_cpu_s(t) - before[k] for k, t in ths.items()}
        return float(out.strip().splitlines()[-1]), cpu, n

    def offline(n: int) -> tuple[float, dict[str, float], int]:
        nonlocal salt
        salt += 1
        stamps: list[float] = []
        done = threading.Event()

        def sink(o: RequestOutput) -> None:
            if o.new_token_ids:
                stamps.append(time.perf_counter())
            if o.finished:
                done.set()

        ths = threads()
        before = {k: thread_cpu_s(t) for k, t in ths.items()}
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        prompt = prompt_ids(args.context, salt)
        req = GenerateRequest(f"off-{salt}", prompt, sp, arrival_time=time.monotonic())
        built.engine.submit(req, sink)
        done.wait(600)
        cpu = {k: thread_cpu_s(t) - before[k] for k, t in ths.items()}
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]), cpu, n

    sides: dict[str, Callable[[int], tuple[float, dict[str, float], int]]] = {
        "offline": offline,
        "served": served,
    }
    try:
        served(8)
        offline(8)
        for r in range(args.rounds):
            for side in ("offline", "served") if r % 2 == 0 else ("served", "offline"):
                clock.steps.clear()
                clock.on = True
                tok_s, cpu, n = sides[side](args.max_tokens)
                clock.on = False
                res = summarize(side, clock, cpu, n, tok_s)
                results[side].append(res)
                print(f"round {r} {side}: {tok_s:.1f} tok/s, step {res['step']:.2f} ms", flush=True)
    finally:
        asyncio.run_coroutine_threadsafe(daemon.drain(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
    keys = list(results["offline"][0])
    print(f"\ncontext {args.context}, {args.max_tokens} tokens, medians of {args.rounds} rounds (ms)")
    print("| per decode step | offline | served | served - offline |")
    print("| --- | ---: | ---: | ---: |")
    for k in keys:
        o = statistics.median(x[k] for x in results["offline"])
        s = statistics.median(x[k] for x in results["served"])
        print(f"| {k} | {o:.3f} | {s:.3f} | {s - o:+.3f} |")


if __name__ == "__main__":
    main()
