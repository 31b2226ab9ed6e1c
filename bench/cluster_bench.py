"""Cache-aware routing across radixd replicas behind smg, against round-robin, on one multi-turn trace.

K tenants x M conversations, each with its own long system prompt, take turns (every conversation's
turn t before any turn t+1, `--clients` at once) against `radixd cluster --replicas 2`, whose KV pools
(`--num-blocks`) are too small to hold every prefix at once. Each policy gets a fresh cluster and the
same trace. Per policy: prompt-token hit rate (cached / prompt, from the responses' usage),
completion tokens/s, TTFT p50 / p90 (first streamed content chunk). Then smg's own overhead: the same
requests straight to one replica over gRPC (radixd.v1), through smg in front of it, and straight again.

    python bench/cluster_bench.py --tenants 5 --conversations 1 --turns 5 --words 10 --num-blocks 64
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from benchkit import Cluster
from radixd_client import Client

Messages = list[dict[str, str]]


def system_prompt(tenant: int, conv: int, words: int) -> str:
    topic = f"tenant {tenant} project {conv}"
    return f"You are the assistant of {topic}. " + " ".join(
        f"Fact {i} of {topic}: item {tenant * 97 + conv * 13 + i} weighs {i * 7 % 50} kilograms."
        for i in range(words)
    )


def model_id(base: str) -> str:
    """The model smg serves (`GET /v1/models`)."""
    with urllib.request.urlopen(base + "/models", timeout=30) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


def chat(base: str, body: dict[str, Any]) -> None:
    """One chat completion through smg, not streamed."""
    req = urllib.request.Request(
        base + "/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def streamed_chat(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat completion: its TTFT (first content chunk), text and usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    url = urllib.parse.urlsplit(base + "/chat/completions")
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", url.path, json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"smg answered {resp.status}: {resp.read()[:500]!r}")
    ttft, text, usage = None, "", {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        for choice in event.get("choices", []):
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text += piece
        usage = event.get("usage") or usage
    conn.close()
    return {"ttft": ttft or time.perf_counter() - t0, "text": text, "usage": usage}


def run_policy(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """The trace through a fresh 2-replica cluster routing by `policy`."""
    n = args.tenants * args.conversations
    convs: list[Messages] = [
        [
            {
                "role": "system",
                "content": system_prompt(i // args.conversations, i % args.conversations, args.words),
            }
        ]
        for i in range(n)
    ]
    records: list[dict[str, Any]] = []
    with Cluster(args.replicas, args.serve, policy=policy) as cluster:
        model = model_id(cluster.base)

        def turn_of(conv: int, turn: int) -> dict[str, Any]:
            messages = [*convs[conv], {"role": "user", "content": f"Question {turn}: what weighs most?"}]
            body = {"model": model, "messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
            out = streamed_chat(cluster.base, body)
            convs[conv] = [*messages, {"role": "assistant", "content": out["text"]}]
            return out

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            for turn in range(args.turns):  # a wave per turn: each conversation after its previous turn
                records += pool.map(lambda c, t=turn: turn_of(c, t), range(n))
        wall = time.perf_counter() - t0
    usage = [r["usage"] for r in records]
    prompt = sum(u.get("prompt_tokens", 0) for u in usage)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usage)
    ttfts = sorted(r["ttft"] for r in records)
    return {
        "policy": policy,
        "requests": len(records),
        "hit_rate": cached / prompt if prompt else 0.0,
        "tok_s": sum(u.get("completion_tokens", 0) for u in usage) / wall,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
    }


def overhead(args: argparse.Namespace) -> dict[str, float]:
    """Requests/s on one replica: straight over gRPC, through smg, straight again (C at once, ignore_eos,
    the replica's cache flushed before each pass)."""
    with Cluster(1, args.serve) as cluster:
        r = cluster.info["replicas"][0]
        client = Client(r["address"], admin_address=r["admin_address"], admin_token=cluster.admin_token)
        model = model_id(cluster.base)
        prompts: list[Messages] = [
            [{"role": "user", "content": f"Write one sentence about the number {i}."}]
            for i in range(args.overhead_requests)
        ]
        sampling: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}

        def direct(m: Messages) -> None:
            client.complete(m, **sampling)

        def gateway(m: Messages) -> None:
            chat(cluster.base, {"model": model, "messages": m, **sampling})

        out: dict[str, float] = {}
        passes: tuple[tuple[str, Callable[[Messages], None]], ...] = (
            ("direct gRPC", direct),
            ("through smg", gateway),
            ("direct gRPC again", direct),
        )
        for name, fn in passes:
            client.flush("wait_for_idle")
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(fn, prompts))
            out[name] = len(prompts) / (time.perf_counter() - t0)
        client.close()
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--conversations", type=int, default=2, help="per tenant")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--words", type=int, default=10, help="facts per system prompt (~22 tokens each)")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--clients", type=int, default=2, help="requests in flight")
    p.add_argument("--num-blocks", type=int, default=64, help="KV blocks per replica")
    p.add_argument("--overhead-requests", type=int, default=24, help="0: no smg overhead pass")
    p.add_argument("--policies", default="cache_aware,round_robin")
    p.add_argument("--replicas", type=int, default=2, help="behind smg in the policy runs")
    args = p.parse_args()
    args.serve = ["--num-blocks", str(args.num_blocks), "--max-num-seqs", "8"]
    results = [run_policy(args, policy) for policy in args.policies.split(",")]
    over = overhead(args) if args.overhead_requests > 0 else None
    print("| policy | requests | hit rate | throughput (tok/s) | TTFT p50 (ms) | TTFT p90 (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['policy']} | {r['requests']} | {r['hit_rate']:.3f} | {r['tok_s']:.1f} |"
            f" {r['ttft_p50'] * 1000:.0f} | {r['ttft_p90'] * 1000:.0f} |"
        )
    if len(results) == 2:
        a, b = results
        print(
            f"\n{a['policy']} / {b['policy']}: hit rate {a['hit_rate'] / max(b['hit_rate'], 1e-9):.2f}x, "
            f"TTFT p50 {a['ttft_p50'] / b['ttft_p50']:.2f}x"
        )
    if over is None:
        return
    direct = (over["direct gRPC"] + over["direct gRPC again"]) / 2
    print("\n| smg overhead, one replica | direct gRPC | through smg | direct gRPC again | smg / direct |")
    print("| --- | --- | --- | --- | --- |")
    cells = " | ".join(f"{v:.2f}" for v in over.values())
    print(f"| requests/s | {cells} | {over['through smg'] / direct:.3f}x |")


if __name__ == "__main__":
    main()
