"""The int8 lm_head (`q8.py`): Q8_0 codes recovered exactly, the compiled kernel computes their
product, bitwise the same for a row whatever its call's rows and thread count, and the quantized
modes hold their head so where the kernel runs."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixd.daemon.loaders import LoadedModel
from radixd.daemon.model.f32 import F32Linear, Widened16Linear
from radixd.daemon.model.linear import GROUP, Int8Linear, OutInLinear, dequantize_groups
from radixd.daemon.model.llama import make_lm_head
from radixd.daemon.model.precision import PRECISIONS, cpu_has_native_bf16
from radixd.daemon.model.q8 import Q8Linear, q8_available
from radixd.kernels.native import cpu_flags
from tests.daemon.test_f32 import assert_rows_as_alone

CPU = torch.device("cpu")
RUNS_HERE = {"avx2", "fma"} <= cpu_flags() and shutil.which("cc") is not None


def q8_0_weights(out_f: int, in_f: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights as a Q8_0 GGUF stores them: w = q * d per 32 inputs, d fp16, each group reaching +-127."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_f, in_f // GROUP, GROUP), generator=g, dtype=torch.int8)
    q[:, :, 3] = 127 * (1 - 2 * torch.randint(0, 2, (out_f, in_f // GROUP), generator=g, dtype=torch.int8))
    d = (torch.rand(out_f, in_f // GROUP, 1, generator=g) * 1e-3 + 1e-5).half().float()
    return (q.float() * d).reshape(out_f, in_f), q.reshape(out_f, in_f)


@pytest.fixture(scope="module")
def head() -> Q8Linear:
    # NOTE: no skip: the int4/int8 modes' head runs this kernel wherever it can build, so a machine
    # that tests radixd must build it (a failure here says why the daemon would fall back).
    assert RUNS_HERE, "the int8 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler on PATH"
    w, _ = q8_0_weights(1000, 576, seed=1)
    return Q8Linear(w, None, torch.bfloat16)


def test_the_kernel_runs_where_the_cpu_and_a_compiler_allow() -> None:
    assert q8_available() == RUNS_HERE


def test_quantizing_q8_0_weights_recovers_the_files_codes(head: Q8Linear) -> None:
    w, codes = q8_0_weights(1000, 576, seed=1)
    assert torch.equal(head.q, codes)
    assert torch.equal(dequantize_groups(head.q, head.scale), w)


def test_the_embedded_models_q8_0_head_is_held_exactly(smollm: LoadedModel) -> None:
    """The tied Q8_0 embedding lies on the int8 grid: the head loses nothing against the GGUF."""
    from radixd.daemon.model.linear import quantize_groups

    e = smollm.model.weights.embed  # the reference model's fp32 dequantization of the file
    assert torch.equal(dequantize_groups(*quantize_groups(e)), e)


def test_the_kernel_computes_the_product_of_its_weights(head: Q8Linear) -> None:
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    want = x.double() @ dequantize_groups(head.q, head.scale).double().t()
    got = head(x)
    assert got.dtype == torch.float32 and got.shape == (9, 1000)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * float(want.abs().max()))


def test_a_row_is_bitwise_the_same_at_any_row_count_and_thread_count(head: Q8Linear) -> None:
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(3)).bfloat16()
    alone = assert_rows_as_alone(head, x)
    assert torch.equal(head(x[::2]), alone[::2])  # a strided input
    assert head(x[:0]).shape == (0, 1000)


def test_a_wrong_width_is_refused(head: Q8Linear) -> None:
    with pytest.raises(ValueError, match=r"\[N, 576\]"):
        head._kernel(torch.zeros(2, 512))


@pytest.mark.parametrize("mode", ["float32", "bfloat16", "int8", "int4", "w4a8"])
def test_each_mode_holds_its_head_as_documented(mode: str) -> None:
    w, _ = q8_0_weights(64, 96, seed=4)
    lin = make_lm_head(w, PRECISIONS[mode], CPU)
    # 16-bit heads run the fp32 kernel where bf16 is emulated (Widened16Linear). Without the kernel,
    # int8 runs its head as its layers and int4 in bf16.
    bf16 = OutInLinear if cpu_has_native_bf16() or not RUNS_HERE else Widened16Linear
    fallback = {"int8": Int8Linear, "int4": OutInLinear}
    want = {"float32": F32Linear, "w4a8": F32Linear, "bfloat16": bf16}.get(mode) or (
        Q8Linear if RUNS_HERE else fallback[mode]
    )
    assert type(lin) is want
    assert lin.weight.dtype == PRECISIONS[mode].dtype
    if mode == "w4a8":
        assert isinstance(lin, F32Linear) and lin.coding == "q8_0_a8"  # the GGUF's Q8_0 head
