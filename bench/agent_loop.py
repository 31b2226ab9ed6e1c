"""An agent's tool loop, timed turn by turn: radixd through smg against llama-server's OpenAI API.

    python bench/agent_loop.py --llama-server DIR/llama-server        # results: docs/agent-tools.md
    python bench/agent_loop.py --smoke                                # 2 turns, radixd only if no peer

Both peers serve the same GGUF (the embedded SmolLM2) and get the same prompts through the official
`openai` client: the task, two tools, a required tool call for `--turns` turns (each turn's calls and
their `role: "tool"` results appended to the history), then one answer. radixd runs as
`radixd cluster --replicas 1` (smg in front; `tools` with tool_choice "required", radixd's grammar on
the call array smg sends). llama-server's tool calling needs a template with tool support, which
SmolLM2's lacks (with `--jinja` it answers in plain text), so it gets the same call array as its own
`response_format` json_schema over the same rendered history (`explicit`). Every turn is streamed: time
to first token is the first chunk (both servers send it with the first generated token), tokens/s the
completion tokens after it over the time to the last chunk. Each peer runs the loop `--reps` times with
a run number in the task (so no run reuses another's cache); the table holds the median per turn.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchkit import Cluster
from llama_server import LlamaServer
from openai import OpenAI

MODEL = "SmolLM2-135M-Instruct"


def _example() -> ModuleType:
    """clients/examples/agent_tools.py, whose toy tools, task and results the loop uses."""
    path = Path(__file__).resolve().parents[1] / "clients" / "examples" / "agent_tools.py"
    spec = importlib.util.spec_from_file_location("agent_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": t} for t in EXAMPLE.TOOLS]
TOOL_CALL_FORMAT = (
    'To call functions, answer with a JSON array only: [{"name":"<function name>","parameters":'
    "{<arguments>}}]. The functions:"
)
TASK = EXAMPLE.TASK + " (run {run})"


def _result(name: str, arguments: str) -> str:
    try:
        return str(EXAMPLE.run_tool(name, json.loads(arguments)))
    except (ValueError, KeyError, TypeError):
        return json.dumps({"error": "arguments do not fit the tool"})


def _turn(client: OpenAI, model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One streamed turn: its timings, usage, text and the tool calls it made."""
    t0 = time.perf_counter()
    first = last = None
    usage = None
    text = ""
    calls: dict[int, dict[str, Any]] = {}
    stream = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            last = time.perf_counter()
            first = first or last
            text += delta.content or ""
            for d in delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
    out = usage.completion_tokens if usage else 0
    details = usage.prompt_tokens_details if usage else None
    decode_s = (last or t0) - (first or t0)
    return {
        "ttft_ms": ((first or time.perf_counter()) - t0) * 1000,
        "tok_s": (out - 1) / decode_s if out > 1 and decode_s > 0 else float("nan"),
        "prompt": usage.prompt_tokens if usage else 0,
        "cached": (details.cached_tokens or 0) if details else 0,
        "out": out,
        "text": text,
        "calls": [calls[i] for i in sorted(calls)],
    }


def call_schema() -> dict[str, Any]:
    """The tool-call array, as smg sends it to radixd for tool_choice "required"."""
    calls = [
        {
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "parameters": t["function"]["parameters"],
            },
            "required": ["name", "parameters"],
        }
        for t in TOOLS
    ]
    return {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}


def explicit(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as plain messages, rendered as radixd's tool rendering does for a template without
    tool support (daemon/server/vllm/tool_template.py): the tools in a system message, each call
    turn's calls as its content."""
    listing = "\n".join(json.dumps(t["function"]) for t in TOOLS)
    out: list[dict[str, Any]] = [{"role": "system", "content": TOOL_CALL_FORMAT + "\n" + listing}]
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "parameters": json.loads(c["function"]["arguments"] or "{}")}
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": json.dumps(calls, separators=(",", ":"))})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def tool_turn(peer: str, client: OpenAI, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """A `tool_choice="required"` turn: through smg's tools for radixd; for llama-server (whose tool
    calling needs a template with tool support, which SmolLM2's lacks) the same array schema as its
    own `response_format` json_schema over the same rendered history, the calls parsed from the text."""
    if peer == "radixd":
        return _turn(client, MODEL, messages, tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
    fmt = {"type": "json_schema", "json_schema": {"name": "calls", "schema": call_schema()}}
    rec = _turn(client, MODEL, explicit(messages), response_format=fmt, max_tokens=max_tokens)
    try:
        parsed = json.loads(rec["text"])
    except ValueError:
        parsed = []
    rec["calls"] = [
        {
            "id": f"call_{i}",
            "name": c["name"],
            "arguments": json.dumps(c["parameters"], separators=(",", ":")),
        }
        for i, c in enumerate(parsed)
    ]
    return rec


def agent_loop(peer: str, client: OpenAI, turns: int, max_tokens: int, run: int) -> list[dict[str, Any]]:
    """`turns` required tool turns then an answer; one record per turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK.format(run=run)}]
    records = []
    for _ in range(turns):
        rec = tool_turn(peer, client, messages, max_tokens)
        records.append(rec)
        calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in rec["calls"]
        ]
        if not calls:  # no call parsed: the turn's text goes on as a plain reply
            messages.append({"role": "assistant", "content": rec["text"] or "(no tool call)"})
            messages.append({"role": "user", "content": "Use the tools."})
            continue
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for c in rec["calls"]:
            messages.append(
                {"role": "tool", "tool_call_id": c["id"], "content": _result(c["name"], c["arguments"])}
            )
    if peer == "radixd":
        final = _turn(client, MODEL, messages, tools=TOOLS, tool_choice="none", max_tokens=max_tokens)
    else:
        final = _turn(client, MODEL, explicit(messages), max_tokens=max_tokens)
    records.append(final)
    return records


def measure(peer: str, base: str, args: argparse.Namespace) -> list[list[dict[str, Any]]]:
    client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    agent_loop(peer, client, 1, args.max_tokens, run=0)  # warm-up: compile, first allocations
    return [agent_loop(peer, client, args.turns, args.max_tokens, run=r + 1) for r in range(args.reps)]


def _median(runs: list[list[dict[str, Any]]], turn: int, key: str) -> float:
    return statistics.median(float(r[turn][key]) for r in runs)


def table(results: dict[str, list[list[dict[str, Any]]]], turns: int) -> str:
    peers = list(results)
    head = "| turn |" + "".join(f" {p} TTFT ms | {p} tok/s | {p} prompt/cached | {p} calls |" for p in peers)
    rows = [head, "|---:|" + "---:|---:|---:|---:|" * len(peers)]
    for t in range(turns + 1):
        label = str(t + 1) if t < turns else "answer"
        row = f"| {label} |"
        for p in peers:
            runs = results[p]
            calls = sum(1 for r in runs if r[t]["calls"]) if t < turns else "-"
            row += (
                f" {_median(runs, t, 'ttft_ms'):.0f} | {_median(runs, t, 'tok_s'):.1f} |"
                f" {_median(runs, t, 'prompt'):.0f}/{_median(runs, t, 'cached'):.0f} |"
                f" {calls}{'/' + str(len(runs)) if t < turns else ''} |"
            )
        rows.append(row)
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", help="llama-server binary (the peer; omitted: radixd alone)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--smoke", action="store_true", help="2 turns, 1 run: checks the script end to end")
    args = ap.parse_args()
    if args.smoke:
        args.turns, args.reps = 2, 1
    results: dict[str, list[list[dict[str, Any]]]] = {}
    with Cluster(replicas=1, serve=["--num-blocks", "512"]) as cluster:
        results["radixd"] = measure("radixd", cluster.base, args)
    if args.llama_server:
        with LlamaServer(args.llama_server, args.threads, extra=["--jinja"]) as url:
            results["llama-server"] = measure("llama-server", url.removesuffix("/completion") + "/v1", args)
    print(f"turns={args.turns} reps={args.reps} max_tokens={args.max_tokens} threads={args.threads}")
    print(table(results, args.turns))


if __name__ == "__main__":
    main()
