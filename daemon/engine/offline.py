"""`radixd generate`: run the engine in-process (no server) on one prompt or a JSONL file of requests.

radixd generate --prompt "Hello" --max-tokens 32 --json
radixd generate --prompts-file reqs.jsonl --json     # lines: "prompt", "messages" or "token_ids"
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from radixd.daemon.engine.config import EngineConfig, add_kv_pool_flags
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.errors import EngineError
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.model.precision import DTYPE_CHOICES, DTYPE_HELP, default_dtype_name
from radixd.daemon.text.tokenizer import TextTokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `radixd generate`."""
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded SmolLM2)")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--token-ids", help="prompt as comma-separated token ids, e.g. 1,2,3")
    src.add_argument("--prompts-file", help="JSONL file of requests, run concurrently in one engine")
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template to --prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--n", type=int, default=1, help="parallel samples, forked copy-on-write")
    parser.add_argument("--json", action="store_true", help="print one JSON object per request")
    add_kv_pool_flags(parser, "KV pool size in blocks", blocks_before_gb=True)
    parser.add_argument("--no-prefix-cache", action="store_true", help="disable prefix caching")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=default_dtype_name(), help=DTYPE_HELP)
    parser.add_argument("--log-level", default="warning", help="engine log level (logs go to stderr)")


@dataclass
class _Collected:
    request_id: str
    n: int
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def sink(self, out: RequestOutput) -> None:
        self.token_ids.setdefault(out.index, []).extend(out.new_token_ids)
        self.text[out.index] = self.text.get(out.index, "") + out.text_delta
        self.prompt_tokens = out.prompt_tokens
        self.cached_tokens = out.cached_tokens
        if out.finished:
            self.finish[out.index] = out.finish_reason
            if out.error:
                self.errors.append(out.error)

    def as_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": self.request_id,
            "token_ids": self.token_ids.get(0, []),
            "text": self.text.get(0, ""),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish.get(0),
        }
        if self.n > 1:
            obj["outputs"] = [
                {
                    "index": i,
                    "token_ids": self.token_ids.get(i, []),
                    "text": self.text.get(i, ""),
                    "finish_reason": self.finish.get(i),
                }
                for i in range(self.n)
            ]
        if self.errors:
            obj["error"] = self.errors[0]
        return obj


def _prompt_ids(tok: TextTokenizer, spec: dict[str, Any]) -> list[int]:
    if "token_ids" in spec:
        ids = spec["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError(f"token_ids must be a list of integers, got {ids!r}")
        return list(ids)
    if "messages" in spec:
        return tok.encode_chat(spec["messages"])
    if "prompt" in spec:
        text = str(spec["prompt"])
        if spec.get("chat"):
            return tok.encode_chat([{"role": "user", "content": text}])
        return tok.encode(text)
    raise ValueError("each request needs one of 'prompt', 'messages' or 'token_ids'")


def _specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    base: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "n": args.n,
        "chat": args.chat,
    }
    if args.prompts_file:
        specs = []
        with open(args.prompts_file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{args.prompts_file}:{lineno}: not valid JSON ({exc})") from exc
                if not isinstance(obj, dict):
                    raise ValueError(f"{args.prompts_file}:{lineno}: each line must be a JSON object")
                specs.append({**base, "id": f"req-{lineno}", **obj})
        return specs
    if args.token_ids is not None:
        try:
            ids = [int(t) for t in args.token_ids.split(",") if t.strip()]
        except ValueError as exc:
            raise ValueError(f"--token-ids must be comma-separated integers, got {args.token_ids!r}") from exc
        return [{**base, "id": "req-1", "token_ids": ids}]
    return [{**base, "id": "req-1", "prompt": args.prompt}]


def _params(spec: dict[str, Any]) -> SamplingParams:
    return SamplingParams(
        max_tokens=int(spec["max_tokens"]),
        temperature=float(spec["temperature"]),
        top_p=float(spec["top_p"]),
        top_k=int(spec["top_k"]),
        seed=spec.get("seed"),
        n=int(spec["n"]),
        stop=tuple(spec.get("stop", ())),
    )


def run(args: argparse.Namespace) -> int:
    """Run `radixd generate`; -> exit code (0 ok, 1 a request failed, 2 bad input)."""
    from radixd.daemon.engine.factory import build_core
    from radixd.daemon.loaders import ModelLoadError, load_model
    from radixd.daemon.process.log import configure

    # stdout carries only results; logs go to stderr.
    configure(level=args.log_level, stream=sys.stderr)
    try:
        specs = _specs(args)
        params = [_params(spec) for spec in specs]  # bad values fail before the model loads
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    except (ValueError, OSError, ModelLoadError) as exc:
        print(f"radixd generate: {exc}", file=sys.stderr)
        return 2
    config = EngineConfig(
        prefix_caching=not args.no_prefix_cache, kv_layout=args.kv_layout, kv_windows=args.kv_windows
    )
    core = build_core(loaded, config, args.num_blocks, args.kv_cache_gb, args.block_size, args.device)
    results: list[_Collected] = []
    for spec, p in zip(specs, params, strict=True):
        try:
            req = GenerateRequest(str(spec["id"]), _prompt_ids(loaded.tokenizer, spec), p)
            core.validator.validate(req)
        except (ValueError, EngineError) as exc:
            print(f"radixd generate: request {spec.get('id')}: {exc}", file=sys.stderr)
            return 2
        col = _Collected(req.request_id, p.n)
        results.append(col)
        core.requests.add(req, col.sink)
    core.run_until_idle()
    failed = False
    for col in results:
        failed |= bool(col.errors)
        if args.json:
            print(json.dumps(col.as_json(), ensure_ascii=False))
        else:
            for i in range(col.n):
                if col.n > 1:
                    print(f"--- {col.request_id} [{i}] ({col.finish.get(i)})")
                print(col.text.get(i, ""))
            for e in col.errors:
                print(f"radixd generate: {col.request_id}: {e}", file=sys.stderr)
    return 1 if failed else 0
