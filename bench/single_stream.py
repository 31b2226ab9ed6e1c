"""One agent's stream, radixd served against llama-server on the same GGUF and token ids (issue 26).

Both servers are started here on loopback with the same thread count; every request is greedy with
`ignore_eos`, sent as token ids, and timed by this client the same way on both sides (streamed:
radixd's gRPC `Generate`, llama-server's `/completion` with `stream`):

- **decode at a context**: one request with a prompt of `--contexts` tokens, `--max-tokens` out;
  decode tok/s = (tokens - 1) / (last token's arrival - first's);
- **one conversation**: `--turns` turns on a `--system`-token system prompt, `--turn-tokens` out per
  turn, each turn's prompt the whole conversation so far (both sides reuse their cached prefix:
  radixd's radix tree, llama-server's slot with `cache_prompt`); tok/s = tokens out / wall time, and
  the mean time to first token;
- **many conversations**: `--conversations` of them at once, `--many-turns` turns each (llama-server
  gets as many slots).

Rounds alternate which server goes first; medians are reported with per-round ratios.

    .venv/bin/python bench/single_stream.py \
        --llama-server DIR/llama/build/bin/llama-server --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llama_server import LlamaServer, require_binary
from radixd_client import AsyncClient
from radixd_client.types import Chunk
from serve_step import Served, prompt_ids


@dataclass
class Reply:
    """One streamed answer: its tokens and when the first and last arrived (perf_counter seconds)."""

    tokens: list[int]
    sent: float
    first: float
    last: float


Generate = Callable[[list[int], int], Awaitable[Reply]]


def radixd_generate(client: AsyncClient) -> Generate:
    async def gen(prompt: list[int], n: int) -> Reply:
        sent = time.perf_counter()
        toks: list[int] = []
        first = last = 0.0
        async for ev in client.generate(prompt, max_tokens=n, temperature=0.0, ignore_eos=True):
            if isinstance(ev, Chunk) and ev.token_ids:
                last = time.perf_counter()
                first = first or last
                toks += ev.token_ids
        return Reply(toks, sent, first, last)

    return gen


def _llama_stream(url: str, prompt: list[int], n: int) -> Reply:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True}
    body |= {"cache_prompt": True, "stream": True, "return_tokens": True}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    sent = time.perf_counter()
    toks: list[int] = []
    first = last = 0.0
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            got = ev.get("tokens") or []
            if got:
                last = time.perf_counter()
                first = first or last
                toks += got
            if ev.get("stop"):
                break
    return Reply(toks, sent, first, last)


def llama_generate(url: str) -> Generate:
    async def gen(prompt: list[int], n: int) -> Reply:
        return await asyncio.to_thread(_llama_stream, url, prompt, n)

    return gen


async def decode_at(gen: Generate, context: int, n: int, salt: int) -> float:
    r = await gen(prompt_ids(context, salt), n)
    return (len(r.tokens) - 1) / (r.last - r.first)


async def conversation(
    gen: Generate, system: list[int], turns: int, n: int, salt: int
) -> tuple[int, list[float]]:
    """One conversation; -> (tokens out, time to first token of each turn)."""
    history = list(system)
    out, ttft = 0, []
    for t in range(turns):
        history += prompt_ids(24, salt * 1000 + t)  # the user's next message
        r = await gen(history, n)
        history += r.tokens
        out += len(r.tokens)
        ttft.append(r.first - r.sent)
    return out, ttft


async def conversations(
    gen: Generate, k: int, turns: int, n: int, system_len: int, salt: int
) -> tuple[float, float]:
    """`k` conversations at once on one shared system prompt; -> (tok/s, mean TTFT seconds)."""
    system = prompt_ids(system_len, salt)
    t0 = time.perf_counter()
    runs = await asyncio.gather(*(conversation(gen, system, turns, n, salt * 100 + i) for i in range(k)))
    wall = time.perf_counter() - t0
    return sum(o for o, _ in runs) / wall, statistics.mean(x for _, ts in runs for x in ts)


async def one_round(
    name: str, gen: Generate, args: argparse.Namespace, rnd: int, out: dict[str, list[float]]
) -> None:
    salt = 7 + rnd * 31  # a new system prompt and new messages every round: nothing cached from before
    for c in args.contexts:
        out[f"{name} decode tok/s at {c}"].append(await decode_at(gen, c, args.max_tokens, salt + c))
    tps, ttft = await conversations(gen, 1, args.turns, args.turn_tokens, args.system, salt + 1)
    out[f"{name} 1 conversation tok/s"].append(tps)
    out[f"{name} 1 conversation TTFT ms"].append(ttft * 1e3)
    tps, ttft = await conversations(
        gen, args.conversations, args.many_turns, args.turn_tokens, args.system, salt + 2
    )
    out[f"{name} {args.conversations} conversations tok/s"].append(tps)
    out[f"{name} {args.conversations} conversations TTFT ms"].append(ttft * 1e3)


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(list)
    os.environ["RADIXD_NUM_THREADS"] = str(args.threads)  # the daemon's torch threads
    model = ["--model", args.model] if args.model else []
    radixd = Served(None, [*model, *args.serve_args.split()])
    llama = LlamaServer(
        args.llama_server, args.threads, slots=args.conversations, context=8192, model=args.model
    )
    try:
        url = llama.ready()
        async with AsyncClient(radixd.address) as client:
            sides = {"radixd": radixd_generate(client), "llama": llama_generate(url)}
            for gen in sides.values():  # warm-up: compile, fault in the weights
                await decode_at(gen, 32, 8, 0)
            for rnd in range(args.rounds):
                order = list(sides) if rnd % 2 == 0 else list(sides)[::-1]
                for name in order:
                    await one_round(name, sides[name], args, rnd, out)
                print(f"round {rnd + 1} done", flush=True)
    finally:
        llama.close()
        radixd.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="path of llama.cpp's llama-server binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--contexts", type=int, nargs="+", default=[32, 3000])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--system", type=int, default=1000, help="system prompt tokens")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=64)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--many-turns", type=int, default=4)
    ap.add_argument("--model", default=None, help="GGUF file of both sides (default: the embedded SmolLM2)")
    ap.add_argument("--serve-args", default="", help="more `radixd serve` flags")
    args = ap.parse_args()
    require_binary(args.llama_server)  # before radixd starts
    out = asyncio.run(measure(args))
    keys = sorted({k.split(" ", 1)[1] for k in out if " " in k})
    print("\n| one stream | radixd | llama-server | radixd / llama (median of per-round ratios) |")
    print("| --- | ---: | ---: | ---: |")
    for k in keys:
        ours, peer = out[f"radixd {k}"], out[f"llama {k}"]
        ratio = statistics.median(a / b for a, b in zip(ours, peer, strict=True))
        print(f"| {k} | {statistics.median(ours):.1f} | {statistics.median(peer):.1f} | {ratio:.2f}x |")
    print("\nrounds: " + json.dumps({k: [round(x, 2) for x in v] for k, v in out.items() if v}))


if __name__ == "__main__":
    main()
