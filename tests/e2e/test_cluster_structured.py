"""Structured outputs and tool calls through the real smg gateway (`radixd cluster`), OpenAI-shaped.

The requests are the JSON bodies the official `openai` client sends for `response_format`
json_schema / json_object and for `tools` with tool_choice "required" or a named function. smg turns
each into a JSON schema on the vLLM wire (json_object into {"type": "object"}; "required" into an
array of {name, parameters}; a named function into its parameters' schema), radixd constrains the
decoding, and smg parses the tool calls back out. Every output is judged by `json.loads` and the
`jsonschema` library against the schema the client sent.
"""

from __future__ import annotations

import json
import urllib.error
from typing import Any

import jsonschema
import pytest
from cluster_kit import MODEL, Cluster, post, stream_chat

from radixd.daemon.server.common import bounds

pytestmark = pytest.mark.slow
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 16}},
                "required": ["city"],
            },
        },
    },
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
ASK_PERSON = [{"role": "user", "content": "Invent a person and describe them as JSON."}]


@pytest.fixture(scope="module")
def cluster(one_replica_cluster: Cluster) -> Cluster:
    return one_replica_cluster


def _chat(cluster: Cluster, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 200, "temperature": 0, **extra}
    return post(cluster.base, "/chat/completions", body)


def test_response_format_json_schema_output_validates(cluster: Cluster) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    done = _chat(cluster, ASK_PERSON, response_format=fmt)
    choice = done["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    text, usage, _ = stream_chat(
        cluster.base,
        {"model": MODEL, "messages": ASK_PERSON, "max_tokens": 200, "temperature": 0, "response_format": fmt},
    )
    assert text == choice["message"]["content"] and usage["completion_tokens"] > 0
    sampled = _chat(cluster, ASK_PERSON, response_format=fmt, temperature=0.9, n=3, seed=3)
    for c in sampled["choices"]:
        jsonschema.validate(json.loads(c["message"]["content"]), PERSON)


def test_response_format_json_object_parses(cluster: Cluster) -> None:
    done = _chat(cluster, ASK_PERSON, response_format={"type": "json_object"})
    choice = done["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def _tool_calls(done: dict[str, Any]) -> list[dict[str, Any]]:
    message = done["choices"][0]["message"]
    calls: list[dict[str, Any]] = message.get("tool_calls") or []
    assert calls, message
    for call in calls:
        assert call["type"] == "function" and call["id"]
    return calls


def test_tool_choice_required_returns_parsed_calls_whose_arguments_validate(cluster: Cluster) -> None:
    done = _chat(cluster, ASK_WEATHER, tools=TOOLS, tool_choice="required")
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in _tool_calls(done):
        fn = call["function"]
        assert fn["name"] in params, fn
        jsonschema.validate(json.loads(fn["arguments"]), params[fn["name"]])


def test_a_named_tool_choice_calls_that_function_with_valid_arguments(cluster: Cluster) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    done = _chat(cluster, ASK_WEATHER, tools=TOOLS, tool_choice=named)
    [call] = _tool_calls(done)
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def test_with_tools_required_and_a_response_format_the_tool_choice_wins(cluster: Cluster) -> None:
    # smg sends one constraint (the tools' array schema): the wire never carries two
    done = _chat(
        cluster, ASK_WEATHER, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}
    )
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in _tool_calls(done):
        jsonschema.validate(json.loads(call["function"]["arguments"]), params[call["function"]["name"]])


def _error(cluster: Cluster, **extra: Any) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as err:
        _chat(cluster, ASK_PERSON, max_tokens=8, **extra)
    return err.value.code, err.value.read().decode()


def test_bad_schemas_are_client_errors_that_say_what_to_fix(cluster: Cluster) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(bounds.MAX_SCHEMA_DEPTH):
        deep = {"type": "array", "items": deep}
    status, body = _error(
        cluster, response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": deep}}
    )
    assert status == 400 and f"deeper than {bounds.MAX_SCHEMA_DEPTH} levels" in body, (status, body)
    huge = {"type": "object", "description": "d" * bounds.MAX_CONSTRAINT_BYTES}
    status, body = _error(
        cluster, response_format={"type": "json_schema", "json_schema": {"name": "huge", "schema": huge}}
    )
    assert status == 400 and "64 KiB" in body, (status, body)
    status, body = _error(
        cluster,
        response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "bogus"}}},
    )
    assert status == 400 and "bogus" in body, (status, body)
    ok = _chat(cluster, ASK_PERSON, max_tokens=4)  # the gateway and the replica keep serving
    assert ok["usage"]["completion_tokens"] == 4
