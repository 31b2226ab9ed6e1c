"""The KV layouts (model/kv_layout.py) and the runner under each: a random-weight Gemma 3 run in the
windowed layout, its sliding tables built by hand (fresh ids per group from one free list, blocks
released to 0 and handed out again as the window slides), gives the full layout's logits bit for bit,
since its layers read the same keys."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from daemon_testkit import triton_language_restored
from tiny_models import write_tiny_gemma3

from radixd import kernels
from radixd.daemon.executor.runner import (
    DecodeRows,
    ModelRunner,
    StepSeq,
    kv_bytes_per_block,
    num_blocks_for_budget,
)
from radixd.daemon.loaders import LoadedModel, load_model
from radixd.daemon.model import KV_LAYOUTS, KVLayout, ModelConfig

VOCAB = 64
WINDOW = 8
BS = 4
NUM_BLOCKS = 96
S, F = "sliding_attention", "full_attention"
# Five sliding layers, two full: lanes 2, three sliding groups (the last holds one layer).
LAYER_TYPES = [S, S, F, S, S, S, F]


def _config(windows: tuple[int, ...]) -> ModelConfig:
    return ModelConfig(VOCAB, 32, 64, len(windows), 4, 2, 16, layer_windows=windows)


def test_full_layout_of_a_model_without_windows() -> None:
    cfg = _config((0, 0, 0))
    full = KVLayout.full(cfg)
    assert (full.lanes, full.layer_lane, full.layer_group, full.window) == (3, (0, 1, 2), (0, 0, 0), 0)
    assert (full.groups, full.sliding_groups) == (1, 0)
    assert KVLayout.windowed(cfg) is None
    assert KVLayout.choose(cfg, "auto") == full == KVLayout.choose(cfg, "full")
    with pytest.raises(ValueError, match="no sliding-window layers"):
        KVLayout.choose(cfg, "windowed")
    with pytest.raises(ValueError, match="unknown KV layout"):
        KVLayout.choose(cfg, "hybrid")
    assert KV_LAYOUTS == ("auto", "full", "windowed")


def test_gemma3_270m_shape() -> None:
    """18 layers, every sixth global: 3 lanes, 5 sliding groups; a block id holds 3 layers."""
    windows = tuple(0 if i % 6 == 5 else 512 for i in range(18))
    cfg = _config(windows)
    lay = KVLayout.windowed(cfg)
    assert lay is not None and lay == KVLayout.choose(cfg, "auto") == KVLayout.choose(cfg, "windowed")
    assert (lay.lanes, lay.groups, lay.sliding_groups, lay.window) == (3, 6, 5, 512)
    assert [lay.layer_group[i] for i in (5, 11, 17)] == [0, 0, 0]
    assert [lay.layer_lane[i] for i in (5, 11, 17)] == [0, 1, 2]
    sliding = [i for i in range(18) if windows[i]]
    assert [(lay.layer_lane[i], lay.layer_group[i]) for i in sliding] == [
        (si % 3, 1 + si // 3) for si in range(15)
    ]
    assert KVLayout.choose(cfg, "full").lanes == 18
    assert kv_bytes_per_block(cfg, 16, torch.float16, lay) * 6 == kv_bytes_per_block(cfg, 16, torch.float16)
    budget = 6 * 1000 * kv_bytes_per_block(cfg, 16, torch.float16)
    assert num_blocks_for_budget(cfg, 16, budget, torch.float16, lay) == 6 * 6000


def test_models_the_windowed_layout_does_not_apply_to() -> None:
    every = _config((8, 8, 8))  # Mistral: every layer windowed
    mixed = _config((8, 16, 0))
    for cfg, why in ((every, "no full-attention layer"), (mixed, r"windows differ \(\[8, 16\]\)")):
        assert KVLayout.windowed(cfg) is None
        assert KVLayout.choose(cfg, "auto") == KVLayout.full(cfg)
        with pytest.raises(ValueError, match=why):
            KVLayout.choose(cfg, "windowed")


def test_a_layout_must_place_every_layer_once() -> None:
    with pytest.raises(ValueError, match="share"):
        KVLayout(2, (0, 0, 1), (1, 1, 0), 8)
    with pytest.raises(ValueError, match="window exactly"):
        KVLayout(2, (0, 1), (0, 0), 8)


# ----------------------------------------------------------------------------------------------
# The runner: a tiny Gemma 3 in both layouts
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Gemma 3 of 7 layers (transformers' classes) saved as a Hugging Face folder."""
    return write_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), LAYER_TYPES, WINDOW, VOCAB)


class HandTables:
    """A sequence's tables in one layout, built as the engine builds them: fresh ids from one free
    list for every group; before each step a sliding table's blocks wholly left of the window of the
    step's first position are released (entry 0, the id back on the free list: handed out again)."""

    def __init__(self, layout: KVLayout, free: list[int]) -> None:
        self.layout = layout
        self.free = free
        self.tables = [array("i") for _ in range(layout.groups)]
        self.released = 0

    def step(self, seq_id: int, tokens: list[int], start: int) -> StepSeq:
        need = -(-(start + len(tokens)) // BS)
        for t in self.tables:
            while len(t) < need:
                t.append(self.free.pop())
        gone = max(0, (start - self.layout.window + 1) // BS) if self.layout.window else 0
        for t in self.tables[1:]:
            for i in range(gone):
                if t[i]:
                    self.free.append(t[i])
                    t[i] = 0
                    self.released += 1
        return StepSeq(seq_id, tokens, start, self.tables[0], None, window_tables=self.tables[1:])


# (admitted at step, prompt length, prefill chunk, decode steps)
SEQS = ((0, 30, 7, 6), (1, 21, 5, 9), (3, 13, 13, 7))


def _drive(
    runner: ModelRunner, seqs: tuple[tuple[int, int, int, int], ...]
) -> tuple[list[torch.Tensor], int]:
    """Run `seqs` (teacher-forced random tokens) step by step, several sequences per step, prefill
    chunks and decode rows mixed; -> every step's logits, and the sliding blocks released."""
    free = list(range(runner.num_blocks - 1, 0, -1))
    g = torch.Generator().manual_seed(7)
    toks = [[int(x) for x in torch.randint(3, VOCAB, (p + d,), generator=g)] for _, p, _, d in seqs]
    hands = [HandTables(runner.layout, free) for _ in seqs]
    done = [0] * len(seqs)
    out: list[torch.Tensor] = []
    step = 0
    while any(done[i] < len(toks[i]) for i in range(len(seqs))):
        batch = []
        for i, (admit, prompt, chunk, _) in enumerate(seqs):
            if step < admit or done[i] == len(toks[i]):
                continue
            n = min(chunk, prompt - done[i]) if done[i] < prompt else 1
            batch.append(hands[i].step(i, toks[i][done[i] : done[i] + n], done[i]))
            done[i] += n
        out.append(runner.step_logits(batch))
        step += 1
    return out, sum(h.released for h in hands)


def _both_layouts(lm: LoadedModel, seqs: tuple[tuple[int, int, int, int], ...] = SEQS) -> None:
    full = ModelRunner(lm.model, NUM_BLOCKS, BS)
    windowed = KVLayout.choose(lm.config, "auto")
    assert windowed.sliding_groups == 3 and windowed.lanes == 2
    win = ModelRunner(lm.model, NUM_BLOCKS, BS, layout=windowed)
    assert len(win.k_caches) == 2 and len(full.k_caches) == len(LAYER_TYPES)
    want, kept = _drive(full, seqs)
    got, released = _drive(win, seqs)
    assert kept == 0 and released > 0
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"step {step}: the layouts' logits differ"


@pytest.mark.parametrize("design", ["compiled", "split"])
def test_windowed_layout_gives_the_full_layouts_logits_float32(
    gemma_dir: Path, monkeypatch: pytest.MonkeyPatch, design: str
) -> None:
    monkeypatch.setenv("RADIXD_CPU_ATTENTION", design)
    lm = load_model(str(gemma_dir), dtype="float32")
    assert lm.config.layer_windows == tuple(WINDOW if t == S else 0 for t in LAYER_TYPES)
    _both_layouts(lm)


def test_windowed_layout_gives_the_full_layouts_logits_in_the_auto_mode(gemma_dir: Path) -> None:
    lm = load_model(str(gemma_dir), dtype="auto")
    _both_layouts(lm)


def test_a_released_block_the_window_still_reads_is_refused(gemma_dir: Path) -> None:
    lm = load_model(str(gemma_dir), dtype="float32")
    runner = ModelRunner(lm.model, NUM_BLOCKS, BS, layout=KVLayout.choose(lm.config, "windowed"))

    def tables(first: int) -> list[array[int]]:
        return [array("i", [first, 20 + g, 30 + g]) for g in range(3)]

    # Position 11 (window 8): keys 4..11, block 0 (tokens 0..3) wholly left of it: 0 is fine there.
    runner.step_logits([StepSeq(0, [5], 11, [1, 2, 3], None, window_tables=tables(0))])
    # Position 10: key 3 is in block 0, which the window still reads.
    with pytest.raises(ValueError, match="sequence 5: sliding table"):
        runner.step_logits([StepSeq(5, [5], 10, [1, 2, 3], None, window_tables=tables(0))])
    # The same refused in the engine's columns, and in a prefill chunk starting there.
    rows = DecodeRows([4, 5], [5, 5], [11, 10], [[1, 2, 3]] * 2, [None, None], [tables(0), tables(0)])
    with pytest.raises(ValueError, match="sequence 5: sliding table"):
        runner.run([], rows)
    with pytest.raises(ValueError, match="sequence 6: sliding table"):
        runner.step_logits([StepSeq(6, [5, 6], 10, [1, 2, 3], None, window_tables=tables(0))])
    # A 0 at a block the window needs, past released ones; a missing sliding table; none at all.
    bad = [array("i", [0, 0, 30]), *tables(1)[1:]]
    with pytest.raises(ValueError, match="sequence 7: sliding table"):
        runner.step_logits([StepSeq(7, [5], 11, [1, 2, 3], None, window_tables=bad)])
    with pytest.raises(ValueError, match="sequence 8: needs 3 sliding tables"):
        runner.step_logits([StepSeq(8, [5], 11, [1, 2, 3], None, window_tables=tables(1)[:2])])
    with pytest.raises(ValueError, match="sequence 9: needs 3 sliding tables"):
        runner.run([], DecodeRows([9], [5], [11], [[1, 2, 3]], [None]))
    full = ModelRunner(lm.model, NUM_BLOCKS, BS)
    with pytest.raises(ValueError, match="sequence 3: needs 0 sliding tables"):
        full.step_logits([StepSeq(3, [5], 11, [1, 2, 3], None, window_tables=tables(1))])


@contextmanager
def _triton_interpreted() -> Iterator[None]:
    """The GPU's path on the CPU: the Triton kernels under their interpreter."""
    with triton_language_restored(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv(kernels.ENV_BACKEND, "triton")
        assert not kernels.host_kernels("cpu")
        yield


@pytest.mark.slow  # the interpreter runs each kernel launch in Python
def test_windowed_layout_on_the_triton_path(gemma_dir: Path) -> None:
    with _triton_interpreted():
        lm = load_model(str(gemma_dir), dtype="float32")
        _both_layouts(lm, ((0, 14, 7, 3), (1, 9, 9, 3)))


def test_layout_of_the_engine(gemma_dir: Path) -> None:
    """build_core puts `EngineConfig.kv_layout`'s layout under the runner and sizes the pool by it."""
    from radixd.daemon.engine.config import EngineConfig
    from radixd.daemon.engine.factory import build_core

    lm = load_model(str(gemma_dir), dtype="float32")
    with pytest.raises(ValueError, match="kv_layout"):
        EngineConfig(kv_layout="hybrid")
    budget = 1 << 20
    gb = budget / (1 << 30)
    full = build_core(lm, EngineConfig(kv_layout="full"), kv_cache_gb=gb, block_size=BS).runner
    auto = build_core(lm, EngineConfig(), kv_cache_gb=gb, block_size=BS).runner
    assert full.layout == KVLayout.full(lm.config) and auto.layout == KVLayout.choose(lm.config, "windowed")
    assert auto.kv_bytes_per_block * len(LAYER_TYPES) == full.kv_bytes_per_block * 2
    assert (
        auto.num_blocks
        == budget // auto.kv_bytes_per_block
        > full.num_blocks
        == budget // full.kv_bytes_per_block
    )
