"""Every Triton kernel compiles for Hopper (sm_90) through ptxas, on a machine with no GPU.

The interpreter accepts code the compiler rejects (e.g. a non-constexpr global in an annotation,
tl.dot shapes under 16, mixed loop-carried types); compiling ahead catches that before a GPU run.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

import radixd.kernels  # noqa: F401

decode = sys.modules["radixd.kernels.paged_decode"]
prefill = sys.modules["radixd.kernels.paged_prefill"]
store = sys.modules["radixd.kernels.store_kv"]
copy = sys.modules["radixd.kernels.copy_blocks"]


def _ptxas_available() -> bool:
    nvidia = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return nvidia.exists() or shutil.which("ptxas") is not None


pytestmark = pytest.mark.slow


def test_ptxas_ships_with_triton() -> None:
    """The compiles below need ptxas, which the triton wheel carries: a missing one is a failure."""
    assert _ptxas_available(), "triton's NVIDIA backend (ptxas) is missing: reinstall triton"


def _compile(fn: Callable[..., None], types: dict[str, str], consts: dict[str, Any], **options: int) -> Any:
    jf = JITFunction(fn)  # not triton.jit: that returns an interpreter wrapper under TRITON_INTERPRET=1
    signature = {name: ("constexpr" if name in consts else types[name]) for name in jf.arg_names}
    src = ASTSource(jf, signature, consts, attrs={})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **options})


def _decode_types(dt: str) -> dict[str, str]:
    ints = ["stride_qs", "stride_qh", "stride_bts", "max_blocks", "num_splits", "window"]
    return {
        **{p: f"*{dt}" for p in ("q_ptr", "k_ptr", "v_ptr")},
        "bt_ptr": "*i32",
        "lens_ptr": "*i32",
        "part_o_ptr": "*fp32",
        "part_ml_ptr": "*fp32",
        "scale": "fp32",
        "stride_kn": "i64",
        "stride_vn": "i64",
        **{p: "i32" for p in ints},
    }


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
@pytest.mark.parametrize(
    ("dt", "group", "d", "b"), [("fp16", 4, 128, 16), ("bf16", 3, 64, 16), ("fp32", 1, 80, 1)]
)
def test_decode_stage1_compiles(dt: str, group: int, d: int, b: int, windowed: bool) -> None:
    consts = {
        "GROUP": group,
        "GROUP_TILE": decode.ROW_TILE,
        "HEAD_DIM": d,
        "D_TILE": max(16, triton.next_power_of_2(d)),
        "NUM_KV_HEADS": 8,
        "BLOCK_SIZE": b,
        "BLOCK_N": decode.DECODE_CONFIG["block_n"],
        "SPLIT": decode.SPLIT_TOKENS,
        "WINDOWED": windowed,
        "FP32_DOT": dt == "fp32",
        "ROWWISE_DOT": False,
    }
    _compile(decode._decode_stage1, _decode_types(dt), consts, num_stages=decode.DECODE_CONFIG["num_stages"])


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
def test_decode_stage2_compiles(windowed: bool) -> None:
    types = {"part_o_ptr": "*fp32", "part_ml_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*bf16"}
    types |= {"stride_os": "i32", "stride_oh": "i32", "num_splits": "i32", "window": "i32"}
    consts = {"NUM_Q_HEADS": 32, "HEAD_DIM": 128, "D_TILE": 128, "SPLIT": decode.SPLIT_TOKENS}
    consts |= {"WINDOWED": windowed}
    _compile(decode._decode_stage2, types, consts)


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
@pytest.mark.parametrize("dt", ["fp16", "fp32"])
def test_prefill_compiles(dt: str, windowed: bool) -> None:
    ints = ["stride_qt", "stride_qh", "stride_bts", "stride_ot", "stride_oh", "max_blocks", "window"]
    types = {p: f"*{dt}" for p in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    types |= {"bt_ptr": "*i32", "cu_ptr": "*i32", "lens_ptr": "*i32", "scale": "fp32"}
    types |= {"stride_kn": "i64", "stride_vn": "i64", **{p: "i32" for p in ints}}
    consts = {
        "GROUP": 4,
        "HEAD_DIM": 80,
        "D_TILE": 128,
        "NUM_KV_HEADS": 8,
        "BLOCK_SIZE": 16,
        "BLOCK_M": decode.ROW_TILE,
        "BLOCK_N": decode.DECODE_CONFIG["block_n"],
        "SPLIT": decode.SPLIT_TOKENS,
        "WINDOWED": windowed,
        "FP32_DOT": dt == "fp32",
        "ROWWISE_DOT": False,
    }
    _compile(prefill._prefill_kernel, types, consts, num_stages=2)


def test_store_and_copy_compile() -> None:
    types = {p: "*bf16" for p in ("k_ptr", "v_ptr", "kc_ptr", "vc_ptr")}
    types |= {"slot_ptr": "*i64", **{p: "i32" for p in ("stride_kt", "stride_kh", "stride_vt", "stride_vh")}}
    types |= {"stride_kcn": "i64", "stride_vcn": "i64"}
    _compile(
        store._store_kv_kernel, types, {"NUM_KV_HEADS": 8, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "TILE": 1024}
    )
    types = {
        "src_ptr": "*fp16",
        "dst_ptr": "*fp16",
        "ops_ptr": "*i64",
        "stride_src": "i64",
        "stride_dst": "i64",
    }
    _compile(copy._copy_kernel, types, {"ROW": 3 * 64, "BLOCK_SIZE": 16, "TILE": 2048})
