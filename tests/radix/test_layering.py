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


def test_no_module_touches_another_objects_private_fields() -> None:
    """Each part of the pool (words, owners, refcounts, allocator, ownership) and of the tree keeps its
    fields to itself: no radix module (nor the engine's KV manager, nor the benchmark adapter) reads or
    writes a private field of any object but ``self``."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"(?<!\bself)(?<!\bcls)\.(_[a-z]\w*)\b")
    assert pattern.search("pool._words") and not pattern.search("self._words")  # the scan sees a breach
    files = sorted((root / "radix").glob("*.py"))
    files += [root / "daemon" / "engine" / "kv.py", root / "bench" / "radix_adapter.py"]
    hits = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert not hits, "private fields used through another object:\n" + "\n".join(hits)


def test_only_the_kv_manager_builds_radix_structures() -> None:
    """The daemon reaches the radix core through `KVManager` (daemon/engine/kv.py): no other module
    builds a pool, a tree or a block table (the host swap pool is a free list of its own)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"\b(BlockPool|RadixTree|BlockTable)\(")
    sources = sorted((root / "daemon").rglob("*.py"))
    assert any(p.name == "kv.py" and pattern.search(p.read_text()) for p in sources)  # the scan sees it
    hits = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for p in sources
        if p.name != "kv.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "radix structures built outside daemon/engine/kv.py:\n" + "\n".join(hits)
