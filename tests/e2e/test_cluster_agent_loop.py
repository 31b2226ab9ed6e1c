"""An agent's tool loop with the official `openai` client through `radixd cluster` (smg in front).

Five turns of `tool_choice="required"` over two tools whose schemas are written as agent frameworks
write them (no `additionalProperties`): every turn must come back as a parsed tool call whose arguments
validate against its tool's schema, its result goes back as a `role: "tool"` message carrying the
call's id, and the history grows; from the second turn on the replica serves the history from its
cache (`usage.prompt_tokens_details.cached_tokens`). Then a final answer with tool_choice "none". The
same loop streamed. json_object and a schema without `additionalProperties` close compactly.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from cluster_kit import MODEL, Cluster
from openai import OpenAI
from test_agent_tools_example import load_example

pytestmark = pytest.mark.slow
TURNS = 5
# The toy tools and their results are the gRPC example's (clients/examples/agent_tools.py).
EXAMPLE = load_example()
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": t} for t in EXAMPLE.TOOLS]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TASK = EXAMPLE.TASK


@pytest.fixture(scope="module")
def client(one_replica_cluster: Cluster) -> OpenAI:
    return OpenAI(base_url=one_replica_cluster.base, api_key="unused", max_retries=0, timeout=120)


def _call(client: OpenAI, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    done = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=48, temperature=0
    )  # type: ignore[call-overload]
    message = done.choices[0].message
    assert message.tool_calls, (done.choices[0].finish_reason, message.content)
    calls = [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.function.name, "arguments": c.function.arguments},
        }
        for c in message.tool_calls
    ]
    details = done.usage.prompt_tokens_details if done.usage else None
    return calls, (details.cached_tokens or 0) if details else 0


def _call_streamed(client: OpenAI, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )  # type: ignore[call-overload]
    calls: dict[int, dict[str, Any]] = {}
    cached = 0
    for chunk in stream:
        if chunk.usage and chunk.usage.prompt_tokens_details:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = delta.id or call["id"]
                if delta.function:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    assert calls, "no tool call was streamed"
    return [calls[i] for i in sorted(calls)], cached


def _loop(client: OpenAI, stream: bool) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for turn in range(TURNS):
        before = len(messages)
        calls, cached = (_call_streamed if stream else _call)(client, messages)
        for call in calls:
            fn = call["function"]
            assert fn["name"] in SCHEMAS and call["id"], call
            arguments = json.loads(fn["arguments"])
            jsonschema.validate(arguments, SCHEMAS[fn["name"]])
            assert set(arguments) <= set(SCHEMAS[fn["name"]]["properties"]), arguments
        if turn > 0:
            assert cached > 0, f"turn {turn + 1}: the growing history was not served from the cache"
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            fn = call["function"]
            content = EXAMPLE.run_tool(fn["name"], json.loads(fn["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        assert len(messages) > before
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=24, temperature=0
    )  # type: ignore[call-overload]
    answer = final.choices[0].message
    assert not answer.tool_calls and answer.content, answer


def test_five_required_tool_turns_then_an_answer(client: OpenAI) -> None:
    _loop(client, stream=False)


def test_the_same_loop_streamed(client: OpenAI) -> None:
    _loop(client, stream=True)


def test_json_object_and_open_schemas_close_compactly(client: OpenAI) -> None:
    prompts = ("Describe Paris as JSON.", "Invent a person as JSON.", "List three fruits as JSON.")
    for prompt in prompts:
        done = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_object"},
            max_tokens=300,
            temperature=0,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        text = choice.message.content or ""
        assert isinstance(json.loads(text), dict) and "\n" not in text and not text.startswith("{ "), text
    schema = SCHEMAS["add"]
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a and b as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "add", "schema": schema}},
        max_tokens=48,
        temperature=0,
    )
    text = done.choices[0].message.content or ""
    assert done.choices[0].finish_reason == "stop" and set(json.loads(text)) == {"a", "b"}, text
    assert " " not in text, text
