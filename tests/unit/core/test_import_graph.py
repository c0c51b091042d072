"""The core's import graph has no cycle: every import inside ``bettercompute`` runs one way.

The import-linter ``layers`` contract (pyproject.toml) orders the core's parts; this test also covers what the
layers leave free: imports between the modules, and inside one part (type-checking imports count, as they do for
the contract).
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def edges(module: str) -> list[str]:
        return sorted(m for m in graph.find_modules_directly_imported_by(module) if m in index or m in set(modules))

    def visit(root: str) -> None:
        nonlocal counter
        work = [(root, iter(edges(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_inside_the_core() -> None:
    graph = grimp.build_graph("bettercompute")
    assert _cycles(graph, "bettercompute") == []


def test_a_cycle_would_be_found() -> None:
    graph = grimp.build_graph("bettercompute")
    graph.add_import(
        importer="bettercompute.ports.store",
        imported="bettercompute._runtime.registry",
        line_number=1,
        line_contents="",
    )
    cycles = _cycles(graph, "bettercompute")
    assert any("bettercompute.ports.store" in c and "bettercompute._runtime.registry" in c for c in cycles)
