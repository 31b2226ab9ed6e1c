"""An agent's tool loop on radixd's own gRPC API: one session, a JSON-schema constraint per turn.

    python clients/examples/agent_tools.py --address 127.0.0.1:50051

The session holds the conversation: a system message listing the tools, the task, then each turn's
tool call (the model's reply, appended by the daemon) and the tool results the agent sends back as
`role: "tool"` messages. Every turn is constrained to the tool-call array
`[{"name": ..., "parameters": {...}}]` built from the tools' schemas, so the reply always parses and
its arguments validate; radixd reads the schemas closed (no undeclared keys) and compact, so a call
closes in a few tokens. Each turn prints how much of its prompt the daemon served from the prefix
cache: only the new messages are computed. A last, unconstrained turn writes the answer.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from radixd_client import Client, Session

TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {
        "name": "add",
        "description": "The sum of two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
]
TASK = "What is 2 plus 3, and what is the weather in Paris? Use the tools."


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The constraint of a tool turn: a non-empty array of calls, each naming one tool and carrying
    arguments for that tool's schema (the shape OpenAI-compatible gateways send for "required")."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, "parameters": t["parameters"]},
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    return {"type": "array", "minItems": 1, "maxItems": 2, "items": {"anyOf": calls}}


def system_prompt(tools: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(t) for t in tools)
    return (
        'To call functions, answer with a JSON array only: [{"name":"<function name>","parameters":'
        "{<arguments>}}]. The functions:\n" + listing
    )


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """The agent's side: run one call (here, two toy tools) and return its result as JSON text."""
    if name == "add":
        return json.dumps({"sum": arguments["a"] + arguments["b"]})
    return json.dumps({"city": arguments["city"], "weather": "sunny", "celsius": 21})


def turn(session: Session, messages: list[dict[str, str]], max_tokens: int, **constraint: Any) -> Any:
    t0 = time.perf_counter()
    done = session.send(messages, max_tokens=max_tokens, temperature=0.0, **constraint).collect()
    end = done.ends[0]
    tps = end.completion_tokens / max(end.total_s - end.ttft_s, 1e-9)
    print(
        f"prompt={done.prompt_tokens:5d} cached={done.cached_tokens:5d} out={end.completion_tokens:3d}"
        f" ttft={end.ttft_s * 1000:7.1f}ms tok/s={tps:6.1f} total={(time.perf_counter() - t0) * 1000:7.1f}ms"
        f"  {done.text}"
    )
    return done


def agent_loop(client: Client, turns: int = 5, max_tokens: int = 48) -> list[dict[str, Any]]:
    """Run `turns` constrained tool turns and a final answer on one session; returns each turn's
    record (calls, prompt and cached tokens) and, last, the answer's."""
    session = client.create_session([{"role": "system", "content": system_prompt(TOOLS)}])
    schema = call_schema(TOOLS)
    messages = [{"role": "user", "content": TASK}]
    records: list[dict[str, Any]] = []
    try:
        for _ in range(turns):
            done = turn(session, messages, max_tokens, json_schema=schema)
            calls = json.loads(done.text)
            records.append({"calls": calls, "prompt": done.prompt_tokens, "cached": done.cached_tokens})
            messages = [{"role": "tool", "content": run_tool(c["name"], c["parameters"])} for c in calls]
        messages.append({"role": "user", "content": "Now answer the task in one sentence."})
        done = turn(session, messages, max_tokens)
        records.append({"answer": done.text, "prompt": done.prompt_tokens, "cached": done.cached_tokens})
    finally:
        session.close()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    with Client(args.address, api_key=args.api_key) as client:
        agent_loop(client, args.turns, args.max_tokens)


if __name__ == "__main__":
    main()
