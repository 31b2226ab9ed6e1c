"""The radix benchmark's adapter (bench/radix_adapter.py) keeps the tree and the pool exact.

The figures against SGLang are only as good as the path they time: these tests drive the adapter
through the peer bench's protocol (match a batch, evict what the batch needs, insert, release) on
small workloads that share prefixes and overflow the pool, and run its own end-of-run check.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

_ROOT = Path(__file__).resolve().parents[2]


def _load_adapter_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("radix_adapter", _ROOT / "bench" / "radix_adapter.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _load_adapter_module()


def _workload(seed: int, n: int, prompt: int, output: int, shared: int) -> list[tuple[Any, Any]]:
    """(prompt, prompt + output) token arrays; every other request starts with one shared prefix."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 49152, shared)
    out = []
    for i in range(n):
        p = rng.integers(0, 49152, prompt)
        if i % 2 == 0:
            p[:shared] = prefix
        out.append((p, np.concatenate([p, rng.integers(0, 49152, output)])))
    return out


def _run(adapter: Any, reqs: list[tuple[Any, Any]], page: int, batch: int = 4) -> tuple[int, int]:
    """The peer bench's driver loop (radix_peer_bench.run_once), untimed; -> (matched, evicted)."""
    matched = evicted = 0
    for start in range(0, len(reqs), batch):
        group = [(adapter.prepare(p), adapter.prepare(f), len(f)) for p, f in reqs[start : start + batch]]
        handles = []
        need = 0
        for p, _f, full_len in group:
            n, h = adapter.match(p)
            handles.append(h)
            matched += n
            need += full_len - n
        need += len(group) * page
        free = adapter.free_tokens()
        if free < need:
            evicted += adapter.evict(need - free)
            assert adapter.free_tokens() >= need - len(group) * page
        for (_p, f, _n), h in zip(group, handles, strict=True):
            adapter.insert(f, h)
        for h in handles:
            adapter.release(h)
    adapter.check()
    return matched, evicted


@pytest.mark.parametrize("page", [1, 16])
def test_pressure_workload_evicts_and_stays_exact(page: int) -> None:
    # Room for six requests of 200 tokens and a batch of four needs ~800: later batches must evict.
    reqs = _workload(seed=page, n=40, prompt=160, output=40, shared=64)
    adapter = bench.Adapter(page, 1280)
    matched, evicted = _run(adapter, reqs, page)
    assert evicted > 0
    assert matched > 0  # the shared prefix is found again between evictions
    assert adapter.pool.num_free + adapter.tree.num_cached_blocks == adapter.capacity_blocks


@pytest.mark.parametrize("page", [1, 16])
def test_a_repeated_prompt_hits_its_cached_whole_blocks(page: int) -> None:
    reqs = _workload(seed=7, n=8, prompt=100, output=20, shared=50)
    adapter = bench.Adapter(page, 1 << 14)  # no pressure
    _run(adapter, reqs, page)
    matched, evicted = _run(adapter, reqs, page)  # the same prompts again: each was cached with its output
    assert evicted == 0
    assert matched == sum(len(p) // page * page for p, _f in reqs)


def test_phases_spread_evictions_over_the_requests() -> None:
    r = {
        "match_us": 4.0,
        "insert_us": 20.0,
        "release_us": 0.5,
        "evict_us_per_call": 30.0,
        "evict_calls": 50,
        "requests": 1000,
        "us_per_request": 26.0,
    }
    line = bench._phases("radixd", r)
    assert "match 4.00 insert 20.00 release 0.50 evict 1.50 = 26.00" in line
