"""No import cycle in the product, type-only imports included, between modules or between folders.

A cycle hidden behind `TYPE_CHECKING` still means two modules that cannot be read, tested or changed
one without the other, so the graph below counts every import statement a module holds, wherever it
stands. An edge goes to the module an import names (`from a.b import c` is an edge to `a.b.c` when
that is a module, else to `a.b`); importing a module does not count as importing its parent packages.

Folders: each folder of the product is a node, with an edge X -> Y when a module directly in X imports a
module directly in Y (X != Y). Without a cycle there, each folder sits above or below every other it
touches: the composition roots (daemon/cli.py, daemon/server/app.py) at the top, imported by nothing
below them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "radixd.radix": ROOT / "radix",
    "radixd.kernels": ROOT / "kernels",
    "radixd.daemon": ROOT / "daemon",
    "radixd_client": ROOT / "clients" / "radixd_client",
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            if "_pb" in rel.parts:
                continue  # generated stubs
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([prefix, *parts])] = path
    return found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _folders(modules: dict[str, Path], graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The folder graph: a module's folder is its package (itself for an `__init__`)."""

    def folder(name: str) -> str:
        return name if modules[name].name == "__init__.py" else name.rpartition(".")[0]

    folders: dict[str, set[str]] = {folder(name): set() for name in modules}
    for name, targets in graph.items():
        folders[folder(name)].update(folder(t) for t in targets if folder(t) != folder(name))
    return folders


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_imports() -> None:
    graph = _graph(_modules())
    assert "radixd.radix.pool" in graph["radixd.radix.table"]
    assert "radixd.daemon.engine.types" in graph["radixd.daemon.engine.engine"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_product() -> None:
    cycles = _cycles(_graph(_modules()))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_folder_graph_sees_imports() -> None:
    modules = _modules()
    folders = _folders(modules, _graph(modules))
    assert "radixd.daemon.executor" in folders["radixd.daemon.engine"]
    assert "radixd.daemon.server.vllm" in folders["radixd.daemon.server"]
    assert "radixd.daemon" not in folders["radixd.daemon.engine"]


def test_the_folder_check_finds_a_cycle() -> None:
    # a.x imports b.y and b.z imports a.w: no module cycle, but the folders a and b form one
    modules = {m: Path(f"{m.replace('.', '/')}.py") for m in ("a.x", "a.w", "b.y", "b.z")}
    graph = {"a.x": {"b.y"}, "a.w": set(), "b.y": set(), "b.z": {"a.w"}}
    assert _cycles(graph) == []
    assert _cycles(_folders(modules, graph)) == [["a", "b"]]


def test_no_folder_cycle_in_the_product() -> None:
    modules = _modules()
    cycles = _cycles(_folders(modules, _graph(modules)))
    assert not cycles, "folder cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
