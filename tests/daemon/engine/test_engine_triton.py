"""The GPU's path of the whole engine, run on the CPU: a tiny random-weight Llama (the embedded model's
tokenizer) served by `EngineCore` with the Triton kernels under the interpreter gives the greedy
tokens of the CPU path on the same weights, through sessions, forks (CoW), preemption, speculation
and constraints. While the Triton path runs, every CPU-only piece (the native library, 2 MiB-page
pools) and every torch twin of a kernel raises if touched: `kernels.host_kernels` keeps them off that
path, and each Triton kernel's launches are counted.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from daemon_testkit import triton_language_restored
from engine_kit import Collector, assert_all_free, greedy, run

from radixd import kernels
from radixd.daemon.engine.commands import CloseSession, CreateSession
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel, convert, default_model_path
from radixd.daemon.model import LlamaModel
from radixd.daemon.model.config import ModelConfig
from radixd.daemon.model.llama import LayerWeights, LlamaWeights
from radixd.daemon.model.precision import PRECISIONS
from radixd.daemon.structured.spec import Constraint
from radixd.daemon.text.tokenizer import TextTokenizer

pytestmark = pytest.mark.slow  # the interpreter runs each kernel launch in Python

REGEX = r"(yes|no)-[0-9]{2}\."
PROMPTS = ("The lighthouse keeper", "Paris is the capital of", "one two three four five")
REPEATS = " ".join(["red green blue"] * 12)
OPS = ("store_kv", "paged_prefill", "paged_decode", "copy_blocks")

Scenario = Callable[[EngineCore, TextTokenizer], dict[str, Any]]


def _tiny(config: ModelConfig) -> ModelConfig:
    """The embedded model's vocabulary and special tokens on a 2-layer decoder (GQA 4:2)."""
    return dataclasses.replace(
        config, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
    )


def _weights(cfg: ModelConfig, seed: int = 0) -> LlamaWeights:
    """Fresh random weights (a `LlamaModel` converts the ones it is given in place)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=g)

    h, inter = cfg.hidden_size, cfg.intermediate_size
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    layers = [
        LayerWeights(
            1 + r(h),
            r(qkv, h),
            None,
            r(h, cfg.num_heads * cfg.head_dim),
            None,
            1 + r(h),
            r(2 * inter, h),
            r(h, inter),
        )
        for _ in range(cfg.num_layers)
    ]
    embed = r(cfg.vocab_size, h, scale=1.0)
    return LlamaWeights(embed=embed, layers=layers, norm=1 + r(h), lm_head=embed)


def _counted(fn: Callable[..., Any], op: str, launches: Counter[str]) -> Callable[..., Any]:
    def launch(*args: Any, **kwargs: Any) -> Any:
        launches[op] += 1
        return fn(*args, **kwargs)

    return launch


def _host_piece_touched(*_: object, **__: object) -> None:
    raise AssertionError("a CPU-only piece ran on the Triton path")


@contextmanager
def _path(triton: bool, launches: Counter[str]) -> Iterator[None]:
    """The CPU path (torch twins, native library), or the GPU's (Triton, interpreted) with the CPU-only
    pieces and the torch twins booby-trapped and each op's Triton launches counted in `launches`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(kernels.ENV_BACKEND, raising=False)
        mp.delenv("RADIXD_CPU_DECODER", raising=False)
        if not triton:
            mp.delenv("TRITON_INTERPRET", raising=False)
        else:
            mp.setenv("TRITON_INTERPRET", "1")
            mp.setenv(kernels.ENV_BACKEND, "triton")
            mp.setattr("radixd.kernels.native.library", _host_piece_touched)
            mp.setattr("radixd.kernels.cpu_attention.library", _host_piece_touched)
            mp.setattr("radixd.daemon.executor.runner.zeros_on_huge_pages", _host_piece_touched)
            for op in OPS:
                module = sys.modules[f"radixd.kernels.{op}"]  # the package's attribute is the function
                mp.setattr(module, f"{op}_torch", _host_piece_touched)
                mp.setattr(module, f"{op}_triton", _counted(getattr(module, f"{op}_triton"), op, launches))
        assert kernels.host_kernels("cpu") is not triton
        yield


def _tokens(col: Collector, rid: str, n: int = 1) -> list[list[int]]:
    return [col.tokens(rid, i) for i in range(n)]


def plain(core: EngineCore, tok: TextTokenizer) -> dict[str, Any]:
    col = run(core, [GenerateRequest(f"p{i}", tok.encode(p), greedy(8)) for i, p in enumerate(PROMPTS)])
    return {"tokens": [_tokens(col, f"p{i}") for i in range(len(PROMPTS))]}


def session(core: EngineCore, tok: TextTokenizer) -> dict[str, Any]:
    core.execute(CreateSession(tokens=tok.encode(PROMPTS[0] + " walked"), session_id="s"))
    first = run(core, [GenerateRequest("t1", tok.encode(" up the stairs"), greedy(6), session_id="s")])
    second = run(core, [GenerateRequest("t2", tok.encode(" and then"), greedy(6), session_id="s")])
    core.execute(CloseSession("s"))
    return {
        "tokens": _tokens(first, "t1") + _tokens(second, "t2"),
        "cached": second.final("t2").cached_tokens,
    }


def forks(core: EngineCore, tok: TextTokenizer) -> dict[str, Any]:
    # n = 3 children share the prompt's partial last block: each one's first write copies it (CoW).
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=3)
    col = run(core, [GenerateRequest("f", tok.encode(PROMPTS[1]), params)])
    return {"tokens": _tokens(col, "f", 3)}


def preemption(core: EngineCore, tok: TextTokenizer) -> dict[str, Any]:
    reqs = [
        GenerateRequest(f"q{i}", tok.encode(f"{p} {i}") * 2, greedy(20)) for i, p in enumerate(PROMPTS * 2)
    ]
    col = run(core, reqs)
    return {"tokens": [_tokens(col, r.request_id) for r in reqs], "preempted": core.stats().preemptions}


def speculation(core: EngineCore, tok: TextTokenizer) -> dict[str, Any]:
    # The second ask drafts the first's reply from the radix tree; both are verified drafts.
    first = run(core, [GenerateRequest("d1", tok.encode(REPEATS), greedy(12))])
    second = run(core, [GenerateRequest("d2", tok.encode(REPEATS), greedy(12))])
    return {
        "tokens": _tokens(first, "d1") + _tokens(second, "d2"),
        "accepted": second.final("d2").accepted_draft_tokens,
    }


def constraint(core: EngineCore, tok: TextTokenizer) -> dict[str, Any]:
    params = SamplingParams(max_tokens=16, temperature=0.0, constraint=Constraint("regex", REGEX))
    col = run(core, [GenerateRequest("c", tok.encode(PROMPTS[2]), params)])
    return {"tokens": _tokens(col, "c"), "text": col.text("c")}


# scenario, the engine's config, its pool in blocks of 16 tokens
SCENARIOS: dict[str, tuple[Scenario, EngineConfig, int]] = {
    "plain": (plain, EngineConfig(), 64),
    "session": (session, EngineConfig(), 64),
    "forks": (forks, EngineConfig(), 64),
    # Six requests of ~30 prompt + 20 new tokens do not fit 12 blocks at once.
    "preemption": (preemption, EngineConfig(max_num_batched_tokens=64), 12),
    "speculation": (speculation, EngineConfig(speculative_tokens=4), 64),
    "constraint": (constraint, EngineConfig(), 64),
}


Served = dict[str, dict[str, Any]]  # scenario -> what it returned, and its Triton "launches"


def _serve(triton: bool, tok: TextTokenizer, cfg: ModelConfig) -> Served:
    out: Served = {}
    launches: Counter[str] = Counter()
    with _path(triton, launches):
        model = LlamaModel(cfg, _weights(cfg), "cpu", PRECISIONS["float32"])
        loaded = LoadedModel(model, tok, cfg, "tiny")
        for name, (scenario, config, blocks) in SCENARIOS.items():
            core = build_core(loaded, config, num_blocks=blocks, device="cpu")
            launches.clear()
            out[name] = scenario(core, tok) | {"launches": dict(launches)}
            assert_all_free(core)
    return out


@pytest.fixture(scope="module")
def served() -> dict[bool, Served]:
    """Every scenario on the CPU path (False) and on the GPU's path under the interpreter (True)."""
    conv = convert(default_model_path())
    cfg = _tiny(conv.config)
    with triton_language_restored():
        return {triton: _serve(triton, conv.tokenizer, cfg) for triton in (False, True)}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_triton_path_serves_the_cpu_paths_tokens(served: dict[bool, Served], name: str) -> None:
    cpu, gpu = dict(served[False][name]), dict(served[True][name])
    assert cpu.pop("launches") == {}
    launches = gpu.pop("launches")
    assert gpu == cpu
    assert gpu["tokens"] and all(gpu["tokens"])
    # The steps ran the Triton kernels (their torch twins raise on this path).
    assert launches["store_kv"] > 0 and launches["paged_prefill"] > 0 and launches["paged_decode"] > 0


def test_each_scenario_exercised_its_feature(served: dict[bool, Served]) -> None:
    gpu = served[True]
    assert gpu["session"]["cached"] > 0  # the second turn attended over the first's cached KV
    forks = gpu["forks"]["tokens"]
    assert len(forks) == 3 and forks[0] == forks[1] == forks[2]
    assert gpu["forks"]["launches"].get("copy_blocks", 0) > 0  # the children's CoW copies
    assert gpu["preemption"]["preempted"] > 0
    spec = gpu["speculation"]
    assert spec["accepted"] > 0 and spec["tokens"][0] == spec["tokens"][1]
    assert re.fullmatch(REGEX, gpu["constraint"]["text"]), gpu["constraint"]["text"]


def test_host_kernels_is_the_one_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ENV_BACKEND, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert kernels.host_kernels("cpu")
    assert not kernels.host_kernels("cuda")
    monkeypatch.setenv(kernels.ENV_BACKEND, "torch")
    assert not kernels.host_kernels("cuda:0")  # the torch twins on a GPU are still the GPU's path
    monkeypatch.setenv(kernels.ENV_BACKEND, "triton")
    assert kernels.host_kernels("cpu")  # no interpreter: the CPU path (whose kernels refuse "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not kernels.host_kernels("cpu")
    monkeypatch.delenv(kernels.ENV_BACKEND)
    assert not kernels.host_kernels("cpu")  # the interpreter's default backend is Triton
    monkeypatch.setenv(kernels.ENV_BACKEND, "torch")
    assert kernels.host_kernels("cpu")  # an explicit torch backend keeps the CPU path
