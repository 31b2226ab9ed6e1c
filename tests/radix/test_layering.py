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


def test_only_the_pool_touches_its_private_fields() -> None:
    """Block ownership changes only through BlockPool methods: no other radix module (nor the engine's
    KV manager, nor the benchmark adapter) reads or writes a private field of the pool."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pool_src = (root / "radix" / "pool.py").read_text()
    slots: list[str] = []
    for node in ast.walk(ast.parse(pool_src)):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            slots = [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    private = [s for s in slots if s.startswith("_")]
    assert "_state" in private and "_evictable" in private  # the scan below looks for the right names
    pattern = re.compile(r"\.(" + "|".join(map(re.escape, private)) + r")\b|\bpool\._\w+")
    files = [p for p in (root / "radix").glob("*.py") if p.name != "pool.py"]
    files += [root / "daemon" / "engine" / "kv.py", root / "bench" / "radix_adapter.py"]
    hits = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "private BlockPool fields used outside pool.py:\n" + "\n".join(hits)


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
