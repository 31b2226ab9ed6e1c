"""Does one client sending the largest prompts move everyone else's latency?

    .venv/bin/python bench/big_prompt_latency.py                  # starts its own `radixd serve`
    .venv/bin/python bench/big_prompt_latency.py --address 127.0.0.1:50051   # a running daemon
    .venv/bin/python bench/big_prompt_latency.py --rounds 3 --seconds 20

Eight clients send small greedy requests back to back (short prompt, 8 tokens) and record each
request's latency; a health checker polls beside them. Phases, alternated `--rounds` times in one run
against one daemon so machine noise hits them alike:

  quiet      the eight clients alone;
  big-text   plus one client sending, back to back, the longest text the daemon tokenizes (exactly its
             character bound; the tokens exceed the context, so it is refused after tokenizing);
  over-bound plus one client sending a text one character over that bound (refused before tokenizing).

Reports per phase the median over rounds of the p50 and p90 latency of the small requests, the ratio
to the quiet phase, health-check p99, and how many big requests were answered. Loopback only; every
loop is bounded by `--seconds`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import grpc
from benchkit import Daemon, model_files, prompt_char_bound
from radixd_client import AsyncClient

SMALL_PROMPT = "Name three colors:"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else float("nan")


async def small_client(address: str, stop: float, out: list[float]) -> None:
    async with AsyncClient(address) as c:
        while time.monotonic() < stop:
            t0 = time.monotonic()
            await c.complete(SMALL_PROMPT, max_tokens=8, temperature=0.0)
            out.append(time.monotonic() - t0)


async def big_client(address: str, stop: float, text: str, counts: dict[str, int]) -> None:
    async with AsyncClient(address) as c:
        while time.monotonic() < stop:
            try:
                await c.complete(text, max_tokens=2)
                counts["ok"] = counts.get("ok", 0) + 1
            except grpc.aio.AioRpcError as exc:
                counts[exc.code().name] = counts.get(exc.code().name, 0) + 1


async def health_client(address: str, stop: float, out: list[float]) -> None:
    async with AsyncClient(address) as c:
        while time.monotonic() < stop:
            t0 = time.monotonic()
            await c.health()
            out.append(time.monotonic() - t0)
            await asyncio.sleep(0.05)


async def phase(address: str, seconds: float, big_text: str | None) -> dict[str, object]:
    stop = time.monotonic() + seconds
    lat: list[float] = []
    health: list[float] = []
    counts: dict[str, int] = {}
    tasks = [small_client(address, stop, lat) for _ in range(8)] + [health_client(address, stop, health)]
    if big_text is not None:
        tasks.append(big_client(address, stop, big_text, counts))
    await asyncio.gather(*tasks)
    return {
        "p50_ms": pct(lat, 50) * 1000,
        "p90_ms": pct(lat, 90) * 1000,
        "requests": len(lat),
        "health_p99_ms": pct(health, 99) * 1000,
        "big": counts,
    }


async def run(
    args: argparse.Namespace, address: str, longest_token: int
) -> tuple[int, dict[str, list[dict[str, object]]]]:
    async with AsyncClient(address) as c:
        char_bound = prompt_char_bound(longest_token, (await c.model_info()).context_length)
        await c.complete(SMALL_PROMPT, max_tokens=8, temperature=0.0)  # warm-up
    texts = {
        "quiet": None,
        "big-text": "word " * (char_bound // 5),
        "over-bound": "w" * (char_bound + 1),
    }
    results: dict[str, list[dict[str, object]]] = {k: [] for k in texts}
    for r in range(args.rounds):
        for name, text in texts.items():
            res = await phase(address, args.seconds, text)
            results[name].append(res)
            print(f"round {r + 1} {name:10s} {res}", flush=True)
    return char_bound, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded SmolLM2)")
    ap.add_argument("--extra", default="", help="extra `radixd serve` flags")
    ap.add_argument("--address", default=None, help="a running daemon of --model (default: start one)")
    args = ap.parse_args()
    # The daemon's own bound: the same tokenizer, the context it reports.
    longest = model_files(args.model).tokenizer.longest_token_chars
    if args.address:
        bound, results = asyncio.run(run(args, args.address, longest))
    else:
        model = ["--model", args.model] if args.model else []
        with Daemon(model + args.extra.split()) as daemon:
            bound, results = asyncio.run(run(args, daemon.address, longest))
    quiet = statistics.median(float(r["p50_ms"]) for r in results["quiet"])  # type: ignore[arg-type]
    print(
        f"\nchar bound {bound}; cores {os.cpu_count()}; {args.rounds} rounds x {args.seconds:g} s per phase"
    )
    print("| phase | p50 ms | p90 ms | p50 ratio | health p99 ms | small requests | big requests |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, rs in results.items():
        p50 = statistics.median(float(r["p50_ms"]) for r in rs)  # type: ignore[arg-type]
        p90 = statistics.median(float(r["p90_ms"]) for r in rs)  # type: ignore[arg-type]
        hp = statistics.median(float(r["health_p99_ms"]) for r in rs)  # type: ignore[arg-type]
        n = sum(int(r["requests"]) for r in rs)  # type: ignore[call-overload]
        big: dict[str, int] = {}
        for r in rs:
            for k, v in r["big"].items():  # type: ignore[attr-defined]
                big[k] = big.get(k, 0) + v
        print(f"| {name} | {p50:.0f} | {p90:.0f} | {p50 / quiet:.2f} | {hp:.1f} | {n} | {big or '-'} |")


if __name__ == "__main__":
    main()
