"""Backend resolution: argument > RADIXD_KERNEL_BACKEND > CUDA > TRITON_INTERPRET > torch."""

from __future__ import annotations

import pytest
import torch

from radixd.kernels import paged_decode, resolve_backend

CPU = torch.device("cpu")


def test_cpu_defaults_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert resolve_backend(None, CPU) == "torch"


def test_interpreter_selects_triton_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend(None, CPU) == "triton"


def test_env_and_argument_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("RADIXD_KERNEL_BACKEND", "torch")
    assert resolve_backend(None, CPU) == "torch"
    assert resolve_backend("triton", CPU) == "triton"


def test_triton_on_cpu_without_interpreter_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", CPU)


def test_unknown_backend_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXD_KERNEL_BACKEND", "cuda")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        resolve_backend(None, CPU)


def test_interpreter_mode_can_change_within_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel first launched under the interpreter keeps working after the env changes again."""
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    k = torch.randn(3, 4, 2, 64)
    v = torch.randn(3, 4, 2, 64)
    q = torch.randn(1, 4, 64)
    bt = torch.tensor([[1, 2]], dtype=torch.int32)
    lens = torch.tensor([6], dtype=torch.int32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a = paged_decode(q, k, v, bt, lens, 0.125)  # auto -> triton (interpreted)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    b = paged_decode(q, k, v, bt, lens, 0.125)  # auto -> torch
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    c = paged_decode(q, k, v, bt, lens, 0.125)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert torch.equal(a, c)
