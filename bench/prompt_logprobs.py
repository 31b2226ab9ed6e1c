"""What prompt logprobs cost a prefill, and what logit bias costs the sampler.

    .venv/bin/python bench/prompt_logprobs.py                      # 512-token prompt, float32
    .venv/bin/python bench/prompt_logprobs.py --tokens 2048 --dtype auto --rounds 7

Prefill: one request of `--tokens` prompt tokens and max_tokens=1 on an engine driven on this thread,
with prompt_logprobs unset, 0 and 5, interleaved `--rounds` times; the cache is flushed before each
run, so every run computes the whole prompt. Reports the median time of each and the ratio to unset.

Sampler: `sample()` over `--rows` rows of the model's vocabulary, rows that ask for logprobs (the
non-plain path every biased row takes), with no row biased and with one row biased; medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams, SamplingState, sample
from radixd.daemon.loaders import load_model


def prefill(args: argparse.Namespace) -> None:
    lm = load_model(dtype=args.dtype)
    core = build_core(lm, EngineConfig(max_num_batched_tokens=args.tokens), num_blocks=args.tokens // 16 + 64)
    ids = (lm.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * args.tokens)[: args.tokens]
    times: dict[str, list[float]] = {"unset": [], "0": [], "5": []}
    outs: list[RequestOutput] = []
    for r in range(args.rounds + 1):  # the first round warms up and is dropped
        for name in times:
            k = None if name == "unset" else int(name)
            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k)
            core.admin.flush("evict_unlocked")
            t0 = time.perf_counter()
            core.requests.add(GenerateRequest(f"{name}-{r}", ids, params), outs.append)
            core.run_until_idle()
            if r:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["unset"])
    print(f"prefill of {args.tokens} tokens ({lm.model.dtype}, {torch.get_num_threads()} threads), medians:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  prompt_logprobs={name:5s} {med * 1e3:8.1f} ms  x{med / base:.3f}")


def sampler(args: argparse.Namespace, vocab: int = 49152) -> None:
    logits = torch.randn(args.rows, vocab)
    plain = [SamplingState(SamplingParams(temperature=0.0, logprobs=1)) for _ in range(args.rows)]
    biased = [*plain[:-1], SamplingState(SamplingParams(temperature=0.0, logprobs=1, logit_bias=((5, 2.0),)))]
    times: dict[str, list[float]] = {"no bias": [], "one row biased": []}
    for _ in range(args.rounds * 10):
        for name, states in (("no bias", plain), ("one row biased", biased)):
            t0 = time.perf_counter()
            sample(logits, states)
            times[name].append(time.perf_counter() - t0)
    print(f"sample() over {args.rows} x {vocab} logits, rows with logprobs=1, medians:")
    for name, ts in times.items():
        print(f"  {name:15s} {statistics.median(ts) * 1e3:7.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rows", type=int, default=64)
    args = p.parse_args()
    prefill(args)
    sampler(args)


if __name__ == "__main__":
    main()
