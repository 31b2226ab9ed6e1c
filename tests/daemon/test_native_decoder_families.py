"""The compiled decoder (native_decoder.py) on the families whose layers add to Llama's: Qwen3 (QK-norm)
and Gemma 3 (QK-norm, post norms, GeGLU, two rope bases, sliding windows), in float32 and in the
default mode on a quantized file (w4a8), Gemma 3 in both KV layouts: it gives the torch path's greedy
tokens and its logits to rounding, and a row's bits do not depend on the rest of its step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_families import _hf_model, _save_hf, _write_gguf

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import load_model
from radixd.daemon.model.kv_layout import KVLayout
from radixd.daemon.model.native_decoder import ENV_DECODER

BS = 4
MAX_BLOCKS = 10  # per sequence and table: 40 positions
N_NEW = 6
Case = tuple[str, str, str]  # (family, mode, KV layout)
Files = dict[tuple[str, str], Path]  # (family, mode) -> the model
# Every case the decoder runs these families in.
CASES: list[Case] = [
    ("qwen3", "float32", "full"),
    ("qwen3", "auto", "full"),
    ("gemma3", "float32", "full"),
    ("gemma3", "float32", "windowed"),
    ("gemma3", "auto", "full"),
    ("gemma3", "auto", "windowed"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    """(family, mode) -> the model: a Hugging Face directory for float32, a Q8_0 GGUF for `auto`."""
    out = {}
    for family in ("qwen3", "gemma3"):
        hf = _hf_model(family)
        path = tmp_path_factory.mktemp(family)
        _save_hf(hf, path)
        _write_gguf(hf, family, path / "q8.gguf", q8=True)
        out[family, "float32"], out[family, "auto"] = path, path / "q8.gguf"
    return out


def _runner(monkeypatch: pytest.MonkeyPatch, files: Files, case: Case, design: str) -> ModelRunner:
    family, mode, layout = case
    monkeypatch.setenv(ENV_DECODER, design)
    lm = load_model(str(files[family, mode]), "cpu", mode)
    assert (lm.model._native is not None) == (design == "native")
    assert lm.model.precision.name == ("w4a8" if mode == "auto" else "float32")
    kv = KVLayout.choose(lm.config, layout)
    assert kv.sliding_groups == (2 if layout == "windowed" else 0)
    return ModelRunner(lm.model, num_blocks=1 + 3 * 3 * MAX_BLOCKS, block_size=BS, layout=kv)


def _seq(runner: ModelRunner, sid: int, ids: list[int], start: int) -> StepSeq:
    """Sequence `sid`'s chunk `ids` at `start`, with its own blocks in every group; a sliding table's
    blocks wholly left of the window are 0 (released), as the engine leaves them."""
    groups = runner.layout.groups

    def table(g: int) -> list[int]:
        return [1 + (sid * groups + g) * MAX_BLOCKS + i for i in range(MAX_BLOCKS)]

    released = max(0, (start - runner.layout.window + 1) // BS) if runner.layout.window else 0
    windows = [[0] * released + table(g)[released:] for g in range(1, groups)]
    return StepSeq(sid, ids, start, table(0), None, window_tables=windows)


def _greedy(runner: ModelRunner, prompts: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prompt 0 in two chunks beside prompt 1 whole, then both decode N_NEW greedy tokens; -> the
    tokens and every step's logits."""
    a, b = prompts
    steps = [[_seq(runner, 0, a[:10], 0), _seq(runner, 1, b, 0)]]
    logits = [runner.step_logits(steps[0])]
    out: list[list[int]] = [[], [int(logits[0][-1].argmax())]]
    logits.append(runner.step_logits([_seq(runner, 0, a[10:], 10), _seq(runner, 1, out[1][-1:], len(b))]))
    out[0].append(int(logits[-1][len(a) - 11].argmax()))
    out[1].append(int(logits[-1][-1].argmax()))
    for _ in range(N_NEW):
        rows = [_seq(runner, s, out[s][-1:], len(p) + len(out[s]) - 1) for s, p in enumerate(prompts)]
        logits.append(runner.step_logits(rows))
        for s in range(2):
            out[s].append(int(logits[-1][s].argmax()))
    return out, logits


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [[int(x) for x in torch.randint(3, 96, (n,), generator=g)] for n in (23, 9)]


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_it_gives_the_torch_paths_tokens_and_logits(
    monkeypatch: pytest.MonkeyPatch, files: Files, case: Case
) -> None:
    got, got_logits = _greedy(_runner(monkeypatch, files, case, "native"), _prompts())
    want, want_logits = _greedy(_runner(monkeypatch, files, case, "torch"), _prompts())
    assert got == want
    # w4a8: the two paths' inputs to an 8-bit projection differ by rounding, which can move an
    # activation's code by one step.
    tol = 1e-5 if case[1] == "float32" else 2e-3
    for g, w in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(g, w, atol=tol * float(w.abs().max()), rtol=0)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "gemma3"], ids="-".join)
def test_a_row_is_bitwise_the_same_alone_and_beside_others(
    monkeypatch: pytest.MonkeyPatch, files: Files, case: Case
) -> None:
    a, b = _prompts()
    together = _runner(monkeypatch, files, case, "native")
    alone = _runner(monkeypatch, files, case, "native")
    steps = [
        ([_seq(together, 0, a[:10], 0), _seq(together, 1, b, 0)], [_seq(alone, 0, a[:10], 0)]),
        ([_seq(together, 1, [7], 9), _seq(together, 0, a[10:], 10)], [_seq(alone, 0, a[10:], 10)]),
        ([_seq(together, 0, [3], 23), _seq(together, 1, [5], 10)], [_seq(alone, 0, [3], 23)]),
    ]
    rows = [slice(0, 10), slice(1, 14), slice(0, 1)]
    for (mixed, solo), r in zip(steps, rows, strict=True):
        assert torch.equal(alone.step_logits(solo), together.step_logits(mixed)[r])
