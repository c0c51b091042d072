"""No import cycle, at any level: between files, and between the packages and files that share a parent.

The import-linter contracts (pyproject.toml) order the core's parts and its built-in modules; this test covers what
they leave free. A cycle between two packages can hide from a file-level search when it enters through private
files (``pools._module`` importing ``nodes._port`` while ``nodes._claims`` imports ``pools._port``): no file lies on
a loop, yet neither package can be understood, moved or versioned without the other. So beside the file graph, the
test looks at each package's children (sub-packages and files) as units, an import anywhere inside one counting as
an edge to the other (type-checking imports count too, as they do for the contracts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp
import pytest

PACKAGES = (
    "bettercompute",
    "bettercompute_store_pg",
    "bettercompute_iam",
    "bettercompute_gateway",
    "bettercompute_daemon",
    "bettercompute_metal",
    "bettercompute_vps",
    "bettercompute_cli",
)


def _components(nodes: Iterable[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
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

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def file_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Cycles between the files of ``package``."""
    modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    return _components(modules, edges)


def package_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Cycles between the children of each package inside ``package``, every import in a child's subtree counted as
    an import by that child."""
    found: list[list[str]] = []
    parents = [package]
    while parents:
        parent = parents.pop()
        children = sorted(graph.find_children(parent))
        parents.extend(children)
        owner = {member: child for child in children for member in {child, *graph.find_descendants(child)}}
        edges: dict[str, set[str]] = {}
        for member, child in owner.items():
            for imported in graph.find_modules_directly_imported_by(member):
                target = owner.get(imported)
                if target is not None and target != child:
                    edges.setdefault(child, set()).add(target)
        found.extend(_components(children, edges))
    return found


@pytest.fixture
def graph() -> grimp.ImportGraph:
    # A graph of its own per test, scanned afresh (a cached scan can be stale): the planting tests change theirs.
    return grimp.build_graph(*PACKAGES, cache_dir=None)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_between_files(graph: grimp.ImportGraph, package: str) -> None:
    assert file_cycles(graph, package) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_between_packages(graph: grimp.ImportGraph, package: str) -> None:
    assert package_cycles(graph, package) == []


def test_a_file_cycle_would_be_found(graph: grimp.ImportGraph) -> None:
    planted = graph
    planted.add_import(
        importer="bettercompute.ports.store",
        imported="bettercompute._runtime.registry",
        line_number=1,
        line_contents="",
    )
    cycles = file_cycles(planted, "bettercompute")
    assert any({"bettercompute.ports.store", "bettercompute._runtime.registry"} <= set(c) for c in cycles)


def test_a_cycle_between_modules_through_private_files_would_be_found(graph: grimp.ImportGraph) -> None:
    # nodes imports pools today (a node belongs to a pool); pools reaching into a private file of nodes that imports
    # nothing of pools closes a loop between the two modules and none between files.
    planted = graph
    planted.add_import(
        importer="bettercompute.modules.pools._service",
        imported="bettercompute.modules.nodes._schemas",
        line_number=1,
        line_contents="",
    )
    assert file_cycles(planted, "bettercompute") == []
    assert ["bettercompute.modules.nodes", "bettercompute.modules.pools"] in package_cycles(planted, "bettercompute")
