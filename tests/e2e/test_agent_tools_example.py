"""clients/examples/agent_tools.py against a real daemon on 127.0.0.1: every constrained turn is a
tool call whose arguments validate, the session serves its history from the cache, and an answer
closes the loop."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import jsonschema
from e2e_kit import RunningDaemon
from radixd_client import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "clients" / "examples" / "agent_tools.py"


def load_example() -> ModuleType:
    """The example as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("agent_tools", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tool_loop_example_runs_on_one_cached_session(daemon: RunningDaemon) -> None:
    example = load_example()
    schemas = {t["name"]: t["parameters"] for t in example.TOOLS}
    with Client(daemon.address, api_key=daemon.api_key) as client:
        records = example.agent_loop(client, turns=3, max_tokens=40)
    *tool_turns, final = records
    assert len(tool_turns) == 3
    for i, record in enumerate(tool_turns):
        assert record["calls"], record
        for call in record["calls"]:
            jsonschema.validate(call["parameters"], schemas[call["name"]])
            assert set(call["parameters"]) <= set(schemas[call["name"]]["properties"]), call
        if i > 0:
            assert record["cached"] > 0 and record["prompt"] > record["cached"], record
    assert final["answer"] and final["cached"] > 0, final
