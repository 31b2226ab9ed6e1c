"""Structured outputs' speed through the engine (the path every wire takes), beside llama-server.

Per round, interleaved so background load drifts hit every case alike (medians over `--rounds`):
- decode tokens/s of constrained generation (a JSON schema with long fixed keys, temperature 0)
  against unconstrained generation of the same lengths (ignore_eos), at batch 1 and `--batch`;
  constrained both with jump-forward (the default) and without;
- the TTFT a constraint adds: a first-seen schema (compiled while the request waits) and a cached
  one, against the same request unconstrained (max_tokens 1, its prompt already cached);
- with `--llama-server PATH`: llama-server's `json_schema` on the same prompt tokens and schema, and
  its unconstrained run of the same length, batch 1, its own timings.

Decode tokens/s: tokens after each request's first, over the first first-token to the last output.

    python bench/structured.py --rounds 3 --batch 32 [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchkit import Constraint, EngineConfig, GenerateRequest, SamplingParams, engine_cores, run_requests
from llama_server import LlamaServer, post, require_binary

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 99999},
        "shipping_address_first_line": {"type": "string", "minLength": 4, "maxLength": 40},
        "is_priority_delivery_requested": {"type": "boolean"},
        "preferred_delivery_time_window": {"type": "string", "enum": ["morning", "afternoon", "evening"]},
        "number_of_items_in_the_order": {"type": "integer", "minimum": 1, "maximum": 50},
    },
    "required": [
        "customer_identification_number",
        "shipping_address_first_line",
        "is_priority_delivery_requested",
        "preferred_delivery_time_window",
        "number_of_items_in_the_order",
    ],
    "additionalProperties": False,
}
Out = dict[str, list[float]]


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    return [
        tokenizer.encode_chat([{"role": "user", "content": f"Write delivery order number {i} as JSON."}])
        for i in range(n)
    ]


def constraint(schema: dict[str, Any]) -> Any:
    return Constraint("json_schema", json.dumps(schema))


def decode_round(
    tokenizer: Any, cores: dict[bool, Any], batch: int, max_tokens: int, rnd: int, out: Out
) -> None:
    """One round at one batch: constrained (jump-forward on, off), unconstrained of the same lengths."""
    ps = prompts(tokenizer, batch)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, constraint=constraint(ORDER))
    cons = [GenerateRequest(f"c{rnd}-{batch}-{i}", p, params) for i, p in enumerate(ps)]
    lengths: list[int] = []
    for jf in (True, False):
        reqs = [dataclasses.replace(r, request_id=f"{r.request_id}-{jf}") for r in cons]
        res = run_requests(cores[jf], reqs)
        out[f"b{batch} constrained jf={'on' if jf else 'off'}"].append(res.decode_tps())
        lengths = [len(res.tokens[r.request_id]) for r in reqs]
    plain = [
        GenerateRequest(
            f"u{rnd}-{batch}-{i}", p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        )
        for i, (p, n) in enumerate(zip(ps, lengths, strict=True))
    ]
    out[f"b{batch} unconstrained"].append(run_requests(cores[True], plain).decode_tps())


def ttft_round(tokenizer: Any, core: Any, rnd: int, reps: int, out: Out) -> None:
    """TTFT (ms) of one request: unconstrained, a first-seen schema, the same schema again (cached),
    `reps` times. The prompt is cached after its first run, so the TTFT is one one-token step plus
    admission: the constraint's share is not buried under a prefill."""
    (p,) = prompts(tokenizer, 1)
    for k in range(reps):
        c = constraint(dict(ORDER, title=f"order-{rnd}-{k}-{time.time_ns()}"))  # never seen: compiled now
        for name, con in (("plain", None), ("first-seen", c), ("cached", c)):
            r = GenerateRequest(
                f"t{rnd}-{k}-{name}", p, SamplingParams(max_tokens=1, temperature=0.0, constraint=con)
            )
            out[f"ttft {name} ms"].append(run_requests(core, [r]).ttft[r.request_id] * 1e3)


def llama_round(url: str, prompt: list[int], max_tokens: int, out: Out) -> None:
    """llama-server at batch 1: `json_schema`, then unconstrained of the same length."""
    base = {"prompt": prompt, "temperature": 0.0, "cache_prompt": False}
    con = post(url, base | {"n_predict": max_tokens, "json_schema": ORDER})["timings"]
    out["llama b1 constrained"].append(float(con["predicted_per_second"]))
    plain = post(url, base | {"n_predict": int(con["predicted_n"]), "ignore_eos": True})["timings"]
    out["llama b1 unconstrained"].append(float(plain["predicted_per_second"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="the batch beside batch 1")
    ap.add_argument("--max-tokens", type=int, default=128, help="constrained requests' limit")
    ap.add_argument("--ttft-reps", type=int, default=5, help="TTFT triples per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary (optional)")
    args = ap.parse_args()
    if args.llama_server:
        require_binary(args.llama_server)
    configs = {jf: EngineConfig(jump_forward=jf) for jf in (True, False)}
    lm, cores = engine_cores(configs, args.dtype, args.threads, num_blocks=2048)
    tok = lm.tokenizer
    llama = LlamaServer(args.llama_server, args.threads) if args.llama_server else None
    url = llama.ready() if llama is not None else ""
    out: Out = collections.defaultdict(list)
    batches = sorted({1, args.batch})
    steps: list[Callable[[int], None]] = [
        *(lambda r, b=b: decode_round(tok, cores, b, args.max_tokens, r, out) for b in batches),
        lambda r: ttft_round(tok, cores[True], r, args.ttft_reps, out),
    ]
    if llama is not None:
        steps.append(lambda r: llama_round(url, prompts(tok, 1)[0], args.max_tokens, out))
    try:
        for rnd in range(-1, args.rounds):  # round -1 warms up (compiles, caches); not kept
            for step in steps:
                step(rnd)
            if rnd < 0:
                out.clear()
            print(f"round {rnd} done", flush=True)
    finally:
        if llama is not None:
            llama.close()
    med = {k: statistics.median(v) for k, v in out.items()}
    print(f"\nmedian decode tok/s over {args.rounds} rounds; constrained / unconstrained\n")
    print("| engine | batch | unconstrained | jump-forward on | ratio | jump-forward off | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for b in batches:
        u, on, off = (med[f"b{b} {k}"] for k in ("unconstrained", "constrained jf=on", "constrained jf=off"))
        print(f"| radixd | {b} | {u:.2f} | {on:.2f} | {on / u:.3f}x | {off:.2f} | {off / u:.3f}x |")
    if llama is not None:
        u, c = med["llama b1 unconstrained"], med["llama b1 constrained"]
        print(f"| llama-server | 1 | {u:.2f} | {c:.2f} | {c / u:.3f}x | | |")
    plain = med["ttft plain ms"]
    print("\n| TTFT (median ms) | unconstrained | first-seen schema | cached schema |")
    print("| --- | --- | --- | --- |")
    first, cached = med["ttft first-seen ms"], med["ttft cached ms"]
    print(f"| time | {plain:.2f} | {first:.2f} | {cached:.2f} |")
    print(f"| added | | {first - plain:+.2f} | {cached - plain:+.2f} |")


if __name__ == "__main__":
    main()
