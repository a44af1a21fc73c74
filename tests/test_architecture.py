"""The import graph of ``dpch`` has no cycle (issue 28; docs/ARCHITECTURE.md).

grimp builds the graph the way import-linter does (function-level imports count). Every strongly
connected component of more than one module is a cycle; the test names its modules and the edges
inside it, so a new cycle fails the suite saying where it is. The layer contracts themselves are
checked by `lint-imports` (pyproject.toml), which `make test` runs before pytest."""
from __future__ import annotations

import sys

import grimp


def _components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(edges):
        if m not in index:
            visit(m)
    return out


def test_components_finds_a_cycle_and_ignores_a_chain():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _components(edges) == [["a", "b", "c"]]
    assert _components({"a": {"b"}, "b": set()}) == []


def test_dpch_import_graph_has_no_cycle():
    graph = grimp.build_graph("dpch")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert len(edges) > 100  # the whole package was read
    cycles = _components(edges)
    report = "\n".join(f"{len(c)} modules: " + "; ".join(f"{a} -> {', '.join(sorted(edges[a] & set(c)))}" for a in c)
                       for c in cycles)
    assert not cycles, f"import cycles in dpch (docs/ARCHITECTURE.md says where each module belongs):\n{report}"
