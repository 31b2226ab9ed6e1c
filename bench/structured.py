"""Structured outputs' speed through the engine (the path every wire takes), beside llama-server.

Per round, interleaved so background load drifts hit every case alike (medians over `--rounds`):
- decode tokens/s of constrained generation (a JSON schema with long fixed keys, temperature 0) against
  unconstrained generation of the same length (ignore_eos, max_tokens = each constrained output's
  length), at batch 1 and `--batch`; constrained both with jump-forward (the default) and without;
- the time to first token a constraint adds: a first-seen schema (compiled while the request waits)
  and a cached one, against the same request unconstrained (max_tokens 1);
- with `--llama-server PATH`: llama-server's `json_schema` on the same prompt tokens and schema, and
  its unconstrained run of the same length (n_predict, ignore_eos), batch 1, its own timings.

Decode tokens/s: tokens after each request's first, over the time from the first first-token to the
last output (prefill excluded on both sides).

    PYTHONPATH=DIR:DIR/clients .venv/bin/python bench/structured.py --rounds 3 \\
        --llama-server DIR/llama/build/bin/llama-server
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

import torch
from llama_server import LlamaServer, post

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel, load_model
from radixd.daemon.structured.spec import Constraint

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
MAX_TOKENS = 128


class Timed:
    """A sink that keeps each request's tokens and when each output arrived."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.ttft: dict[str, float] = {}
        self.errors: list[str] = []

    def __call__(self, out: RequestOutput) -> None:
        now = time.perf_counter()
        toks = self.tokens.setdefault(out.request_id, [])
        if not toks and out.new_token_ids:
            self.first[out.request_id] = now
            if out.ttft_s is not None:
                self.ttft[out.request_id] = out.ttft_s
        toks.extend(out.new_token_ids)
        self.last[out.request_id] = now
        if out.finish_reason == "error":
            self.errors.append(f"{out.request_id}: {out.error}")

    def decode_tps(self) -> float:
        n = sum(len(t) - 1 for t in self.tokens.values())
        return n / (max(self.last.values()) - min(self.first.values()))


def run(core: EngineCore, reqs: list[GenerateRequest]) -> Timed:
    sink = Timed()
    for r in reqs:
        core.requests.add(r, sink)
    core.run_until_idle()
    if sink.errors:
        raise RuntimeError(sink.errors)
    return sink


def prompts(lm: LoadedModel, n: int) -> list[list[int]]:
    return [
        lm.tokenizer.encode_chat([{"role": "user", "content": f"Write delivery order number {i} as JSON."}])
        for i in range(n)
    ]


def schema_constraint(schema: dict[str, Any]) -> Constraint:
    return Constraint("json_schema", json.dumps(schema))


def decode_round(
    lm: LoadedModel, cores: dict[bool, EngineCore], batch: int, rnd: int, out: dict[str, list[float]]
) -> None:
    """One round at one batch: constrained (jump-forward on, off), unconstrained of the same lengths."""
    ps = prompts(lm, batch)
    c = schema_constraint(ORDER)
    cons = [
        GenerateRequest(
            f"c{rnd}-{i}", p, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, constraint=c)
        )
        for i, p in enumerate(ps)
    ]
    lengths: list[int] = []
    for jf in (True, False):
        reqs = [dataclasses.replace(r, request_id=f"{r.request_id}-{jf}") for r in cons]
        res = run(cores[jf], reqs)
        out[f"b{batch} constrained jf={'on' if jf else 'off'}"].append(res.decode_tps())
        lengths = [len(res.tokens[r.request_id]) for r in reqs]
    plain = [
        GenerateRequest(f"u{rnd}-{i}", p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        for i, (p, n) in enumerate(zip(ps, lengths, strict=True))
    ]
    out[f"b{batch} unconstrained"].append(run(cores[True], plain).decode_tps())


def ttft_round(lm: LoadedModel, core: EngineCore, rnd: int, out: dict[str, list[float]], reps: int) -> None:
    """TTFT (ms) of one request: unconstrained, a first-seen schema, the same schema again (cached),
    interleaved `reps` times. The prompt is in the prefix cache after its first run, so the TTFT is
    one one-token step plus admission: the constraint's share is not buried under a prefill."""
    (p,) = prompts(lm, 1)
    for k in range(reps):
        fresh = dict(ORDER, title=f"order-{rnd}-{k}-{time.time_ns()}")  # never seen: compiled now
        c = schema_constraint(fresh)
        cases: list[tuple[str, Constraint | None]] = [("plain", None), ("first-seen", c), ("cached", c)]
        for name, con in cases:
            params = SamplingParams(max_tokens=1, temperature=0.0, constraint=con)
            r = GenerateRequest(f"t{rnd}-{k}-{name}", p, params)
            out[f"ttft {name} ms"].append(run(core, [r]).ttft[r.request_id] * 1e3)


def llama_round(url: str, prompt: list[int], out: dict[str, list[float]]) -> None:
    """llama-server at batch 1: `json_schema`, then unconstrained of the same length."""
    base = {"prompt": prompt, "temperature": 0.0, "cache_prompt": False}
    con = post(url, base | {"n_predict": MAX_TOKENS, "json_schema": ORDER})
    n = int(con["timings"]["predicted_n"])
    out["llama b1 constrained"].append(float(con["timings"]["predicted_per_second"]))
    plain = post(url, base | {"n_predict": n, "ignore_eos": True})
    out["llama b1 unconstrained"].append(float(plain["timings"]["predicted_per_second"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary (optional)")
    ap.add_argument("--ttft-reps", type=int, default=5, help="TTFT triples per round")
    ap.add_argument("--sections", default="decode,ttft,llama", help="comma-separated subset to run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(dtype=args.dtype)
    cores = {jf: build_core(lm, EngineConfig(jump_forward=jf), num_blocks=2048) for jf in (True, False)}
    llama = LlamaServer(args.llama_server, args.threads) if args.llama_server else None
    url = llama.ready() if llama is not None else ""
    out: dict[str, list[float]] = collections.defaultdict(list)
    sections = set(args.sections.split(","))
    steps: list[Callable[[int], None]] = []
    if "decode" in sections:
        steps.append(lambda r: decode_round(lm, cores, 1, r, out))
        steps.append(lambda r: decode_round(lm, cores, args.batch, r, out))
    if "ttft" in sections:
        steps.append(lambda r: ttft_round(lm, cores[True], r, out, args.ttft_reps))
    if llama is not None and "llama" in sections:
        steps.append(lambda r: llama_round(url, prompts(lm, 1)[0], out))
    try:
        for rnd in range(-1, args.rounds):  # round -1 warms up (compiles, caches); not kept
            for s in steps:
                s(rnd)
            if rnd < 0:
                out.clear()
            print(f"round {rnd} done", flush=True)
    finally:
        if llama is not None:
            llama.close()
    med = {k: statistics.median(v) for k, v in out.items()}
    for k, v in sorted(med.items()):
        print(f"{k:40s} median {v:9.2f}   rounds {' '.join(f'{x:.2f}' for x in out[k])}")
    if "decode" in sections:
        for b in (1, args.batch):
            u = med[f"b{b} unconstrained"]
            for jf in ("on", "off"):
                print(
                    f"b{b} constrained jf={jf} / unconstrained: {med[f'b{b} constrained jf={jf}'] / u:.3f}x"
                )
    if llama is not None and "llama" in sections:
        ratio = med["llama b1 constrained"] / med["llama b1 unconstrained"]
        print(f"llama b1 constrained / unconstrained: {ratio:.3f}x")
    if "ttft" in sections:
        print(
            f"ttft added: first-seen {med['ttft first-seen ms'] - med['ttft plain ms']:.2f} ms, "
            f"cached {med['ttft cached ms'] - med['ttft plain ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
