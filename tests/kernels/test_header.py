"""native.py's ctypes mirror of kernels/radixd.h: enums, struct fields and entry points, parsed from the
header and compared, so that a change on one side without the other fails here."""

from __future__ import annotations

import ctypes
import enum
import re
from pathlib import Path
from typing import Any

import radixd.kernels.native as native

HEADER = Path(native.__file__).with_name("radixd.h")
ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {
    "radixd_dtype": (native.DType, "RADIXD_"),
    "radixd_weights": (native.Weights, "RADIXD_W_"),
}
STRUCTS: dict[str, type[ctypes.Structure]] = {
    "radixd_attn": native.Attn,
    "radixd_proj": native.Proj,
    "radixd_layer": native.Layer,
    "radixd_step": native.Step,
}
SCALARS: dict[str, Any] = {
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
}


def _ctype(base: str, pointer: bool) -> Any:
    """The ctypes type the mirror uses for a C type: data pointers as c_void_p, struct pointers typed."""
    if pointer:
        return ctypes.POINTER(STRUCTS[base]) if base in STRUCTS else ctypes.c_void_p
    return STRUCTS.get(base) or SCALARS[base]


def _declarators(decl: str) -> list[tuple[str, Any]]:
    """`const void *k, *v` -> [("k", c_void_p), ("v", c_void_p)]."""
    m = re.fullmatch(r"(?:const\s+)?(?:struct\s+)?(\w+)\s*(.*)", decl.strip(), flags=re.DOTALL)
    assert m is not None, decl
    base, rest = m.groups()
    out = []
    for part in rest.split(","):
        name = part.strip().lstrip("*").strip()
        out.append((name, _ctype(base, "*" in part)))
    return out


def _typedefs(text: str, kind: str) -> dict[str, str]:
    """name -> body of every `typedef enum {...} name;` (kind "enum") or struct."""
    found = re.findall(rf"typedef {kind}(?:\s+\w+)?\s*\{{(.*?)\}}\s*(\w+);", text, re.DOTALL)
    return {name: body for body, name in found}


def mismatches(text: str) -> list[str]:
    """Every way the header `text` and native.py's mirror differ (empty: they agree)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.DOTALL)
    protos = re.findall(r"^\s*(\w+)\s+(radixd_\w+)\s*\(([^)]*)\);", text, re.MULTILINE)
    header: dict[str, Any] = {
        **{
            n: {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", b)}
            for n, b in _typedefs(text, "enum").items()
        },
        **{
            n: [f for d in b.split(";") if d.strip() for f in _declarators(d)]
            for n, b in _typedefs(text, "struct").items()
        },
        **{
            fn: (SCALARS[ret], [_declarators(p)[0][1] for p in params.split(",")])
            for ret, fn, params in protos
        },
    }
    mirror: dict[str, Any] = {
        **{n: {prefix + m.name: int(m.value) for m in cls} for n, (cls, prefix) in ENUMS.items()},
        **{n: [(f[0], f[1]) for f in cls._fields_] for n, cls in STRUCTS.items()},
        **{fn: (ret, list(args)) for fn, (ret, args) in native.SIGNATURES.items()},
    }
    return [
        f"{name}: header {header.get(name)}, mirror {mirror.get(name)}"
        for name in sorted(header.keys() | mirror.keys())
        if header.get(name) != mirror.get(name)
    ]


def test_the_mirror_matches_the_header() -> None:
    assert mismatches(HEADER.read_text()) == []


def test_a_change_on_one_side_is_found() -> None:
    text = HEADER.read_text()
    changes = [
        ("RADIXD_BF16 = 1", "RADIXD_BF16 = 3"),  # an enum value
        ("    float scale;\n    int32_t io_dtype;", "    int32_t io_dtype;\n    float scale;"),  # field order
        ("int64_t n, k;", "int64_t n, k, ld;"),  # a new field
        (
            "int radixd_gemm(const radixd_proj *p, const float *x, int64_t m,",
            "int radixd_gemm(const radixd_proj *p, const float *x, int m,",
        ),
        ("#endif", "int radixd_new_kernel(const float *x);\n#endif"),  # a declaration without binding
    ]
    for old, new in changes:
        assert old in text, old
        assert mismatches(text.replace(old, new)), new
