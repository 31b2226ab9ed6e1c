"""The float32 decoder in one compiled call (native_decoder.py): it runs where the float32 projections
run, answers as the layer-by-layer torch path does to rounding, writes the same KV, keeps every row
bitwise the same whatever else its step holds, and refuses what it cannot run."""

from __future__ import annotations

import pytest
import torch
from daemon_testkit import tiny_model

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.model.f32 import f32_available
from radixd.daemon.model.native_decoder import ENV_DECODER, choice
from radixd.daemon.model.precision import PRECISIONS, precision_of_dtype
from radixd.kernels.cpu_attention import plan_rows

BS = 4


def _runner(monkeypatch: pytest.MonkeyPatch, design: str, mode: str = "float32", **kw: bool) -> ModelRunner:
    monkeypatch.setenv(ENV_DECODER, design)
    model = tiny_model(seed=3, precision=PRECISIONS[mode], **kw)
    assert (model._native is not None) == (design == "native")
    return ModelRunner(model, num_blocks=64, block_size=BS)


def _steps() -> list[list[StepSeq]]:
    """A prompt in two chunks beside a second prompt, then decode rows beside a third prompt's chunk."""
    a = [int(x) for x in torch.randint(0, 64, (23,), generator=torch.Generator().manual_seed(1))]
    b = [int(x) for x in torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(2))]
    c = [int(x) for x in torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(3))]
    ta, tb, tc = list(range(1, 9)), list(range(9, 13)), list(range(13, 16))
    return [
        [StepSeq(0, a[:10], 0, ta, None), StepSeq(1, b, 0, tb, None)],
        [StepSeq(0, a[10:22], 10, ta, None), StepSeq(1, [5], 9, tb, None)],
        [StepSeq(0, [a[22]], 22, ta, None), StepSeq(2, c, 0, tc, None), StepSeq(1, [7], 10, tb, None)],
    ]


def test_it_runs_the_float32_model_where_the_float32_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DECODER, raising=False)
    assert choice() == "auto"
    assert (tiny_model()._native is not None) == f32_available()
    # Other modes keep the layer-by-layer path.
    assert tiny_model(precision=precision_of_dtype(torch.bfloat16))._native is None


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("q4_1", [False, True])
def test_it_answers_as_the_torch_path_and_writes_the_same_kv(
    monkeypatch: pytest.MonkeyPatch, bias: bool, q4_1: bool
) -> None:
    native = _runner(monkeypatch, "native", bias=bias, q4_1=q4_1)
    torch_ = _runner(monkeypatch, "torch", bias=bias, q4_1=q4_1)
    for step in _steps():
        got, want = native.step_logits(step), torch_.step_logits(step)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    for mine, theirs in zip(
        native.k_caches + native.v_caches, torch_.k_caches + torch_.v_caches, strict=True
    ):
        torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-5)


def test_w4a8_runs_it_too_and_answers_as_its_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same projections with 8-bit activations: the two paths' inputs to them differ by rounding,
    which can move an activation's code by one step, so the answers agree to that, not to fp32's."""
    native = _runner(monkeypatch, "native", mode="w4a8", q4_1=True)
    torch_ = _runner(monkeypatch, "torch", mode="w4a8", q4_1=True)
    assert native.model.precision.name == "w4a8"
    for step in _steps():
        got, want = native.step_logits(step), torch_.step_logits(step)
        torch.testing.assert_close(got, want, atol=2e-3 * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize("design", ["native", "torch"])
def test_w4a8_pools_are_f16_holding_the_fp32_rows_rounded_to_nearest_even(
    monkeypatch: pytest.MonkeyPatch, design: str
) -> None:
    """Layer 0's K/V do not depend on the pool (attention reads it only after the store), so an f16
    pool must hold exactly the fp32 pool's rows rounded as torch rounds them, on both paths."""
    half = _runner(monkeypatch, design, mode="w4a8", q4_1=True)
    assert half.dtype == torch.float16 and half.k_caches[0].dtype == torch.float16
    full = ModelRunner(half.model, num_blocks=64, block_size=BS, dtype=torch.float32)
    step = _steps()[0]
    half.step_logits(step)
    full.step_logits(step)
    assert torch.equal(half.k_caches[0], full.k_caches[0].half())
    assert torch.equal(half.v_caches[0], full.v_caches[0].half())
    assert half.k_caches[0].abs().amax() > 0  # the step did store something


@pytest.mark.parametrize("mode", ["float32", "w4a8"])
def test_a_row_is_bitwise_the_same_alone_and_beside_others(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    steps = _steps()
    together = _runner(monkeypatch, "native", mode=mode, q4_1=True)
    mixed = [together.step_logits(s) for s in steps]
    alone = _runner(monkeypatch, "native", mode=mode, q4_1=True)
    # Sequence 0 alone: its chunks and its decode row, nothing beside them.
    solo = [alone.step_logits([s for s in step if s.seq_id == 0]) for step in steps]
    assert torch.equal(solo[0], mixed[0][:10])
    assert torch.equal(solo[1], mixed[1][:12])
    assert torch.equal(solo[2], mixed[2][:1])


def test_bad_input_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner(monkeypatch, "native")
    with pytest.raises(ValueError, match="ids outside"):
        runner.step_logits([StepSeq(0, [1, 2, 3], 0, [64], None)])
    model = runner.model
    assert model._native is not None
    kc = runner.k_caches[0]
    with pytest.raises(ValueError, match="slot_mapping"):
        plan = plan_rows(torch.tensor([[1]], dtype=torch.int32), torch.zeros(1), torch.zeros(1), BS, 64)
        h = torch.zeros(1, 64)
        cos = sin = torch.zeros(1, 1, 16)
        groups = [0] * len(runner.k_caches)
        slots = [torch.tensor([64 * BS])]
        tables = plan.tables[None]
        model._native.forward(h, [(cos, sin)], slots, plan, tables, groups, runner.k_caches, runner.v_caches)
    with pytest.raises(ValueError, match="block ids"):
        # A second KV group whose table names a block outside the pool.
        bad = torch.cat((plan.tables[None], torch.full_like(plan.tables[None], 64)))
        groups = [1] * len(runner.k_caches)
        slots = [torch.tensor([0]), torch.tensor([0])]
        model._native.forward(h, [(cos, sin)], slots, plan, bad, groups, runner.k_caches, runner.v_caches)
    assert kc.abs().sum() == 0  # nothing was written
    monkeypatch.setenv(ENV_DECODER, "fast")
    with pytest.raises(ValueError, match=ENV_DECODER):
        choice()
