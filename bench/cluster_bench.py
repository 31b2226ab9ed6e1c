"""Cache-aware routing across radixd replicas behind smg, against round-robin, on one multi-turn trace.

    python bench/cluster_bench.py --tenants 3 --conversations 2 --turns 4 --words 10 --num-blocks 64

K tenants x M conversations, each with its own long system prompt, take turns (interleaved, C clients
at once) against `radixd cluster --replicas 2`, whose KV pools are too small to hold every prefix at
once. Each policy gets a fresh cluster and the same trace. Reported per policy: prompt-token hit rate
(cached / prompt, from the responses' usage), completion-token throughput, TTFT p50/p90 (streamed
chat). Then smg's own overhead: the same requests straight to one replica over gRPC (radixd.v1) and
through smg in front of that replica alone. The plot (hit rate and TTFT over the trace, per policy) is
written to --plot.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from cluster_kit import MODEL, SseStream, post, start_cluster
from radixd_client import Client

TOKEN = "e2e-admin-token"  # cluster_kit's admin token


def system_prompt(tenant: int, conv: int, words: int) -> str:
    topic = f"tenant {tenant} project {conv}"
    return f"You are the assistant of {topic}. " + " ".join(
        f"Fact {i} of {topic}: item {tenant * 97 + conv * 13 + i} weighs {i * 7 % 50} kilograms."
        for i in range(words)
    )


def trace(tenants: int, convs: int, turns: int, words: int) -> list[tuple[int, int]]:
    """(conversation, turn) in the order they are sent: every conversation's turn t before turn t+1."""
    n = tenants * convs
    return [(c, t) for t in range(turns) for c in range(n)]


def streamed_chat(base: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    stream = SseStream(base, "/chat/completions", body)
    ttft, text, usage = None, "", {}
    for event in stream.events():
        for choice in event.get("choices", []):
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text += piece
        usage = event.get("usage") or usage
    stream.close()
    return {"ttft": ttft or time.perf_counter() - t0, "text": text, "usage": usage}


def run_policy(args: argparse.Namespace, policy: str, tmp: Path) -> dict[str, Any]:
    (tmp / policy).mkdir(parents=True, exist_ok=True)
    c = start_cluster(tmp / policy, 2, *args.serve, policy=policy)
    try:
        n = args.tenants * args.conversations
        convs = [
            [
                {
                    "role": "system",
                    "content": system_prompt(i // args.conversations, i % args.conversations, args.words),
                }
            ]
            for i in range(n)
        ]
        order = trace(args.tenants, args.conversations, args.turns, args.words)
        records: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            # one wave per turn: the conversations of a turn run C at a time, each after its previous turn
            for turn in range(args.turns):
                wave = [conv for conv, t in order if t == turn]

                def one(conv: int, turn: int = turn) -> dict[str, Any]:
                    messages = [
                        *convs[conv],
                        {"role": "user", "content": f"Question {turn}: what weighs most?"},
                    ]
                    out = streamed_chat(c.base, messages, args.max_tokens)
                    convs[conv] = [*messages, {"role": "assistant", "content": out["text"]}]
                    return {"conv": conv, "turn": turn, **out}

                records.extend(pool.map(one, wave))
        wall = time.perf_counter() - t0
    finally:
        c.ensure_stopped()
    prompt = sum(r["usage"].get("prompt_tokens", 0) for r in records)
    cached = sum((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for r in records)
    completion = sum(r["usage"].get("completion_tokens", 0) for r in records)
    ttfts = sorted(r["ttft"] for r in records)
    return {
        "policy": policy,
        "requests": len(records),
        "hit_rate": cached / prompt if prompt else 0.0,
        "throughput_tok_s": completion / wall,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
        "wall_s": wall,
        "series": [
            {
                "ttft": r["ttft"],
                "cached": (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                "prompt": r["usage"].get("prompt_tokens", 0),
            }
            for r in records
        ],
    }


def overhead(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """Requests per second on one replica: straight over gRPC vs through smg (same requests, C at once)."""
    (tmp / "overhead").mkdir(parents=True, exist_ok=True)
    c = start_cluster(tmp / "overhead", 1, *args.serve)
    try:
        r = c.info["replicas"][0]
        client = Client(r["address"], admin_address=r["admin_address"], admin_token=TOKEN)
        prompts = [
            [{"role": "user", "content": f"Write one sentence about the number {i}."}]
            for i in range(args.overhead_requests)
        ]

        def direct(m: list[dict[str, str]]) -> None:
            client.complete(m, max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

        def gateway(m: list[dict[str, str]]) -> None:
            body = {
                "model": MODEL,
                "messages": m,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            post(c.base, "/chat/completions", body)

        out: dict[str, float] = {}
        for name, fn in (("direct_grpc", direct), ("through_smg", gateway), ("direct_grpc_again", direct)):
            client.flush("wait_for_idle")
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(fn, prompts))
            out[name] = len(prompts) / (time.perf_counter() - t0)
        return out
    finally:
        c.ensure_stopped()


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for res in results:
        series = res["series"]
        hits, prompts, rates = 0, 0, []
        for s in series:
            hits += s["cached"]
            prompts += s["prompt"]
            rates.append(hits / prompts if prompts else 0.0)
        xs = range(1, len(series) + 1)
        ax1.plot(xs, rates, label=res["policy"])
        ax2.plot(xs, [s["ttft"] * 1000 for s in series], marker=".", label=res["policy"])
    ax1.set_ylabel("cumulative hit rate")
    ax1.legend()
    ax2.set_ylabel("TTFT (ms)")
    ax2.set_xlabel("request in trace order")
    fig.suptitle("2 radixd replicas behind smg: cache_aware vs round_robin")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--conversations", type=int, default=2, help="per tenant")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--words", type=int, default=10, help="facts per system prompt (~22 tokens each)")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--clients", type=int, default=2, help="requests in flight")
    p.add_argument("--num-blocks", type=int, default=64, help="KV blocks per replica")
    p.add_argument("--overhead-requests", type=int, default=24)
    p.add_argument("--policies", default="cache_aware,round_robin")
    p.add_argument("--plot", default="docs/bench-cluster.png")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    args.serve = ["--num-blocks", str(args.num_blocks), "--max-num-seqs", "8"]
    tmp = Path(tempfile.mkdtemp(prefix="radixd-cluster-bench-"))
    results = [run_policy(args, policy, tmp) for policy in args.policies.split(",")]
    over = overhead(args, tmp)
    plot(results, Path(args.plot))
    print("| policy | requests | hit rate | throughput (tok/s) | TTFT p50 (ms) | TTFT p90 (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['policy']} | {r['requests']} | {r['hit_rate']:.3f} | {r['throughput_tok_s']:.1f} |"
            f" {r['ttft_p50'] * 1000:.0f} | {r['ttft_p90'] * 1000:.0f} |"
        )
    print(f"\nsmg overhead, one replica, requests/s: {json.dumps({k: round(v, 3) for k, v in over.items()})}")
    direct = (over["direct_grpc"] + over["direct_grpc_again"]) / 2
    print(f"through smg / direct gRPC = {over['through_smg'] / direct:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"policies": results, "overhead": over}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
