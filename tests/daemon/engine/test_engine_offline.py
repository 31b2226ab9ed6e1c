"""`radixd generate` (offline, in-process): one prompt, token ids, n > 1 and a JSONL file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from radixd.daemon.engine import offline
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]]]:
    parser = argparse.ArgumentParser()
    offline.add_arguments(parser)
    code = offline.run(parser.parse_args(argv))
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_generate_json(smollm: LoadedModel, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prompt = "The capital of France is"
    code, objs = _run(["--prompt", prompt, "--max-tokens", "5", "--json"], capsys)
    assert code == 0 and len(objs) == 1
    o = objs[0]
    assert len(o["token_ids"]) == 5 and o["finish_reason"] == "length"
    assert o["text"] == smollm.tokenizer.decode(o["token_ids"], skip_special_tokens=True)
    assert o["prompt_tokens"] == len(smollm.tokenizer.encode(prompt)) and o["cached_tokens"] == 0

    argv = ["--token-ids", "1,2,3", "--n", "3", "--temperature", "0.9", "--seed", "4", "--max-tokens", "4"]
    code, objs = _run([*argv, "--json"], capsys)
    assert code == 0 and [len(x["token_ids"]) for x in objs[0]["outputs"]] == [4, 4, 4]

    f = tmp_path / "reqs.jsonl"
    system = "You are a helpful assistant who answers in one short sentence. " * 3
    lines = [
        {"id": f"q{i}", "prompt": system + q, "max_tokens": 3} for i, q in enumerate(["Hi?", "Yo?", "Hey?"])
    ]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code, objs = _run(["--prompts-file", str(f), "--json"], capsys)
    assert code == 0 and [o["id"] for o in objs] == ["q0", "q1", "q2"]
    assert objs[0]["cached_tokens"] == 0 and all(o["cached_tokens"] >= 32 for o in objs[1:])


def test_generate_bad_input(smollm: LoadedModel, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    offline.add_arguments(parser)
    assert offline.run(parser.parse_args(["--token-ids", "1,x", "--json"])) == 2
    assert "comma-separated" in capsys.readouterr().err
    assert offline.run(parser.parse_args(["--prompt", "hi", "--temperature", "-1"])) == 2
    assert "temperature" in capsys.readouterr().err
