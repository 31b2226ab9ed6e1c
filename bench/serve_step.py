"""Batch-1 decode speed served vs offline: what the serving path costs a decode step.

For each `--context` (prompt tokens) it runs the same greedy request (`--max-tokens` out, EOS ignored)
- **offline**: the same engine in this process, on its engine thread (`Engine`), with a sink that
  only records when each output arrives: no server, no event loop, no gRPC;
- **served**: a real `radixd serve` started by this script on 127.0.0.1 (its own process, one command,
  the same flags) and one streaming `Generate` from the asyncio client in this process.

Decode tok/s = (tokens - 1) / (time of the last token - time of the first), so prefill and TTFT are
out of it. Rounds alternate the order (offline, served, served, offline, ...) and medians are
reported, because this 2-core machine is shared and drifts.

    PYTHONPATH=$PWD:$PWD/clients .venv/bin/python bench/serve_step.py --contexts 32 3000 --rounds 4

`--address HOST:PORT` measures an already running daemon instead of starting one (no offline side
then unless `--offline` is also given); `--serve-args "..."` passes flags to the started daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchkit import (
    Daemon,
    EngineConfig,
    GenerateRequest,
    RequestOutput,
    SamplingParams,
    build_engine,
    default_dtype_name,
)
from radixd_client import AsyncClient
from radixd_client.types import Chunk


def prompt_ids(n: int, salt: int) -> list[int]:
    """A deterministic prompt of `n` ordinary token ids (distinct per salt, so no prefix is cached)."""
    return [1000 + (i * 7919 + salt * 104729) % 30000 for i in range(n)]


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) each thread of `pid` has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id, from `py-spy dump` (empty when py-spy is not installed)."""
    try:
        spy = Path(sys.executable).with_name("py-spy")
        text = subprocess.run([str(spy), "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return {}
    return {int(m[1]): m[2] for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]*)"', text)}


class CpuShares:
    """CPU milliseconds per generated token, by thread, over the requests measured."""

    def __init__(self, pid: int, names: dict[int, str]) -> None:
        self.pid = pid
        self.names = names
        self.ms: dict[str, list[float]] = {}

    def measure(self, run: Callable[[], tuple[float, int]]) -> float:
        before = thread_cpu(self.pid)
        tok_s, tokens = run()
        after = thread_cpu(self.pid)
        per: dict[str, float] = {}
        for tid, t in after.items():
            name = self.names.get(tid, "native threads (torch workers, gRPC core)")
            per[name] = per.get(name, 0.0) + (t - before.get(tid, 0.0))
        for name, t in per.items():
            self.ms.setdefault(name, []).append(1000 * t / max(1, tokens))
        return tok_s

    def table(self) -> list[str]:
        return [f"    {n}: {statistics.median(v):.2f} ms/token" for n, v in sorted(self.ms.items())]


def decode_tok_s(stamps: list[tuple[float, int]]) -> tuple[float, int]:
    """(arrival time, tokens in that output) -> (tokens after the first per second, all tokens)."""
    total = sum(n for _, n in stamps)
    if len(stamps) < 2:
        return 0.0, total
    return (total - stamps[0][1]) / (stamps[-1][0] - stamps[0][0]), total


class Offline:
    """The engine thread of a daemon without the daemon around it."""

    def __init__(self, dtype: str | None, stream_interval: int) -> None:
        self.built = build_engine(config=EngineConfig(stream_interval=stream_interval), dtype=dtype)
        self.built.engine.start()

    def run(self, prompt: list[int], max_tokens: int) -> tuple[float, int]:
        stamps: list[tuple[float, int]] = []
        done = threading.Event()

        def sink(out: RequestOutput) -> None:
            if out.new_token_ids:
                stamps.append((time.perf_counter(), len(out.new_token_ids)))
            if out.finished:
                done.set()

        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        rid = f"offline-{time.monotonic_ns()}"
        self.built.engine.submit(GenerateRequest(rid, prompt, sp, arrival_time=time.monotonic()), sink)
        if not done.wait(600):
            raise RuntimeError("offline request did not finish")
        return decode_tok_s(stamps)

    def close(self) -> None:
        self.built.engine.shutdown(1.0)


class Served:
    """A daemon on loopback: the one at `address`, else a `radixd serve` subprocess started here."""

    def __init__(self, address: str | None, serve_args: list[str]) -> None:
        self.daemon: Daemon | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        if address is None:
            self.daemon = Daemon(serve_args)
            self.proc, address = self.daemon.proc, self.daemon.address
        self.address = address

    async def _run(self, prompt: list[int], max_tokens: int) -> tuple[float, int]:
        stamps: list[tuple[float, int]] = []
        async with AsyncClient(self.address) as client:
            stream = client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            async for event in stream:
                if isinstance(event, Chunk) and event.token_ids:
                    stamps.append((time.perf_counter(), len(event.token_ids)))
        return decode_tok_s(stamps)

    def run(self, prompt: list[int], max_tokens: int) -> tuple[float, int]:
        return asyncio.run(self._run(prompt, max_tokens))

    def close(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 3000])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dtype", default=None, help="--dtype of both sides (default: the daemon's)")
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--address", default=None)
    p.add_argument("--offline", action="store_true", help="with --address: measure offline too")
    p.add_argument("--no-offline", action="store_true")
    p.add_argument("--serve-args", default="")
    args = p.parse_args()
    extra = [*shlex.split(args.serve_args), "--stream-interval", str(args.stream_interval)]
    if args.dtype:
        extra += ["--dtype", args.dtype]
    served = Served(args.address, extra)
    want_offline = not args.no_offline and (args.address is None or args.offline)
    # NOTE: the offline side resolves the daemon's default itself (build_engine's None means fp32).
    offline = Offline(args.dtype or default_dtype_name(), args.stream_interval) if want_offline else None
    results: dict[str, dict[int, list[float]]] = {"offline": {}, "served": {}}
    # CPU per token of every thread of the daemon (served) and of this process (offline), per context.
    cpu: dict[tuple[str, int], CpuShares] = {}
    served_names = thread_names(served.proc.pid) if served.proc is not None else {}
    served_names[served.proc.pid if served.proc is not None else -1] = "event loop (main thread)"
    own_names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    salt = os.getpid()
    try:
        for c in args.contexts:  # warm both sides (first-call costs, allocator growth) at this context
            if offline:
                offline.run(prompt_ids(c, salt), 8)
            served.run(prompt_ids(c, salt + 1), 8)
        for r in range(args.rounds):
            for c in args.contexts:
                order = ["offline", "served"] if r % 2 == 0 else ["served", "offline"]
                for side in order:
                    salt += 2
                    prompt = prompt_ids(c, salt)
                    if side == "offline":
                        if offline is None:
                            continue
                        shares = cpu.setdefault((side, c), CpuShares(os.getpid(), own_names))
                        v = shares.measure(lambda p=prompt: offline.run(p, args.max_tokens))
                    elif served.proc is not None:
                        shares = cpu.setdefault((side, c), CpuShares(served.proc.pid, served_names))
                        v = shares.measure(lambda p=prompt: served.run(p, args.max_tokens))
                    else:
                        v = served.run(prompt, args.max_tokens)[0]
                    results[side].setdefault(c, []).append(v)
                    print(f"round {r} context {c} {side}: {v:.1f} tok/s", flush=True)
    finally:
        served.close()
        if offline:
            offline.close()
    print("\n| context | offline tok/s | served tok/s | served / offline | offline ms | served ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in args.contexts:
        s = statistics.median(results["served"][c])
        o = statistics.median(results["offline"][c]) if results["offline"].get(c) else float("nan")
        print(f"| {c} | {o:.1f} | {s:.1f} | {s / o:.2f} | {1000 / o:.1f} | {1000 / s:.1f} |")
    for (side, c), shares in sorted(cpu.items()):
        print(f"CPU per token, {side}, context {c} (the daemon's threads / this process's):")
        print("\n".join(shares.table()))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
