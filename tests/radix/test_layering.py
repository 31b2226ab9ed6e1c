"""radix/ is the pure-Python core: importing it must not pull in torch, triton or grpc."""

from __future__ import annotations

import subprocess
import sys


def test_radix_imports_neither_torch_nor_grpc() -> None:
    code = (
        "import sys, radixd.radix, radixd.radix.verify\n"
        "heavy = sorted(m for m in ('torch', 'triton', 'grpc') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"radixd.radix imported {out.stdout.strip()}"
