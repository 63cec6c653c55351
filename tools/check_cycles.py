"""Fail when modules of service/, shm/, load/ or trireme/ import each other in a circle (docs/architecture.md).

Every import counts: module level, inside functions, and under TYPE_CHECKING (a circle of type-only imports is
still two modules that cannot be understood apart). Uses grimp, which import-linter installs.
Usage: python tools/check_cycles.py [package ...]   (default: service shm load trireme); exit 1 when a circle exists.
"""

from __future__ import annotations

import os
import sys

import grimp

PACKAGES = ("service", "shm", "load", "trireme")


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of two or more modules that reach each other through imports (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
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
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def main(argv: list[str]) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    packages = argv or list(PACKAGES)
    graph = grimp.build_graph(*packages, cache_dir=None)
    groups = strongly_connected(graph)
    for group in groups:
        members = set(group)
        first = group[0]
        # one concrete circle through the group's first module, for the message
        chain = graph.find_shortest_chain(
            importer=next(m for m in sorted(graph.find_modules_directly_imported_by(first)) if m in members),
            imported=first,
        )
        print(f"import circle among {', '.join(group)}")
        if chain:
            print(f"  e.g. {first} -> {' -> '.join(chain)}")
    print(f"{len(groups)} import circle(s) in {', '.join(packages)}")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
